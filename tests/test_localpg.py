"""The throwaway Postgres used by tests and the demo, including the PyPI fallback."""

import psycopg
import pytest

from queueworker.localpg import LocalPostgres, embedded_bin_dir
from queueworker.migrate import migrate


@pytest.mark.integration
def test_embedded_postgres_from_pypi_starts_and_migrates():
    bin_dir = embedded_bin_dir()
    if bin_dir is None:
        pytest.skip("the pgserver wheel is not installed (pip install queueworker[test])")
    server = LocalPostgres(bin_dir=bin_dir)
    try:
        dsn = server.start()
        migrate(dsn)
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM queueworker.tasks").fetchone()[0] == 0
            assert conn.info.server_version >= 140000
    finally:
        server.destroy()
