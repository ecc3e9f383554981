"""KEP-1623 conditions: the full list is rewritten each tick, transition times kept when unchanged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TYPES = ("Ready", "ReplicaFailure", "Active", "Paused", "Fallback", "Limited", "DrainSafe")


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True", "False" or "Unknown"
    reason: str
    message: str


def status_of(flag: bool | None) -> str:
    return "Unknown" if flag is None else str(bool(flag))


def render(new: list[Condition], previous: list[dict[str, Any]] | None, generation: int, now: str
           ) -> list[dict[str, Any]]:
    """The conditions list to write, in TYPES order; lastTransitionTime moves only when status flips."""
    before = {c.get("type"): c for c in previous or []}
    rendered = []
    for condition in sorted(new, key=lambda c: TYPES.index(c.type)):
        old = before.get(condition.type)
        since = old.get("lastTransitionTime", now) if old and old.get("status") == condition.status else now
        rendered.append({"type": condition.type, "status": condition.status, "reason": condition.reason,
                         "message": condition.message, "observedGeneration": generation,
                         "lastTransitionTime": since})
    return rendered


def find(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)
