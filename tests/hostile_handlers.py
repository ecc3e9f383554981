"""Handlers for the hostile-inputs suite: each builds a hostile value from a storable recipe.

A payload cannot carry NaN, NUL or a lone surrogate (Postgres refuses them), so it carries a
recipe and the handler builds the value inside the worker:
  {"str": [code points]}  {"float": "nan" | "inf" | "-inf" | number}  {"power_of_ten": digits}
  {"deep": levels}  {"blob": characters}  {"list": [recipes]}  {"dict": [[key recipe, recipe]]}
  {"set": []}; anything else stands for itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

from queueworker import task


def build(recipe: Any) -> Any:
    if isinstance(recipe, dict) and len(recipe) == 1:
        (kind, arg), = recipe.items()
        if kind == "str":
            return "".join(map(chr, arg))
        if kind == "float":
            return float(arg)
        if kind == "power_of_ten":
            return 10 ** arg
        if kind == "deep":
            value: list = []
            for _ in range(arg):
                value = [value]
            return value
        if kind == "blob":
            return "x" * arg
        if kind == "list":
            return [build(item) for item in arg]
        if kind == "dict":
            return {build(key): build(value) for key, value in arg}
        if kind == "set":
            return set()
    return recipe


@task(name="hostile.return")
def hostile_return(payload: dict) -> Any:
    return build(payload["value"])


@task(name="hostile.return_async")
async def hostile_return_async(payload: dict) -> Any:
    return build(payload["value"])


@task(name="hostile.raise")
async def hostile_raise(payload: dict) -> None:
    raise RuntimeError(build(payload["message"]))


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise ValueError("this exception cannot be rendered")


@task(name="hostile.unprintable")
def hostile_unprintable(payload: dict) -> None:
    raise UnprintableError()


@task(name="hostile.cancel_itself")
async def hostile_cancel_itself(payload: dict) -> None:
    raise asyncio.CancelledError()


@task(name="ok")
def ok(payload: dict) -> dict:
    return {"n": payload["n"]}
