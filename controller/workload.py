"""What the controller reads of a workload's pod template where its pods run `queueworker worker`
(a scaleTargetRef of the user's own): the worker's flags that bear on drain safety and on the
database's connection budget. Pods that do not run it tell nothing (None, or the safe guess)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .deployment import DEFAULT_GRACE_PERIOD_SECONDS


def _worker_containers(workload: dict[str, Any]) -> Iterator[tuple[dict[str, Any], list[str]]]:
    """(pod spec, command + args) of each container running `queueworker worker`."""
    pod = ((workload.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in pod.get("containers") or []:
        words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
        if "worker" in words:
            yield pod, words


def _flag(words: list[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V` among `words`, if given."""
    for index, word in enumerate(words):
        if word.startswith(f"{name}="):
            return word.split("=", 1)[1]
        if word == name and index + 1 < len(words):
            return words[index + 1]
    return None


def worker_drain(workload: dict[str, Any]) -> tuple[int | None, int | None]:
    """(grace period, --drain-seconds) of a workload whose pod template runs `queueworker worker`
    (command or args), else (None, None)."""
    for pod, words in _worker_containers(workload):
        value = _flag(words, "--drain-seconds")
        if value is not None:
            try:
                return int(pod.get("terminationGracePeriodSeconds", DEFAULT_GRACE_PERIOD_SECONDS)), int(float(value))
            except (ValueError, OverflowError):  # "nan", "inf": not a drain we can judge
                return None, None
    return None, None


def worker_processes(workload: dict[str, Any]) -> int:
    """Worker processes one pod of the workload runs: `queueworker worker --processes N`; 1 where
    that is not given or not readable (the worker's own default)."""
    for _pod, words in _worker_containers(workload):
        value = _flag(words, "--processes")
        if value is not None:
            try:
                return max(1, int(value))
            except ValueError:
                return 1
    return 1
