-- Queue grants (migration 016): which queues a producer login may use (queueworker.client.grants:
-- `queueworker grant`, `revoke` and `grants`). Each statement is declared, with its parameter and row
-- types, in queueworker/db/grants.py.

-- name: grant_queue
-- Through a definer function, which checks that the role exists and the pattern is a glob over queue
-- names; `added` is false when the role already had exactly that pattern.
SELECT queueworker.grant_queue(%(role)s, %(pattern)s) AS added;

-- name: revoke_queue
-- Removes exactly that pattern of that role; `removed` is false when there was none.
SELECT queueworker.revoke_queue(%(role)s, %(pattern)s) AS removed;

-- name: queue_grants
-- Every grant, by role and pattern, with whether its role still exists (a dropped role's grants bind
-- nobody, but a new role of the same name would inherit them: revoke them).
SELECT g.grantee AS role, g.pattern, g.granted_by, g.granted_at,
       EXISTS (SELECT FROM pg_roles r WHERE r.rolname = g.grantee) AS role_exists
FROM queueworker.queue_grants g
ORDER BY g.grantee, g.pattern;
