"""A Plan fact computed on first use and kept: the descriptor every fact class of ``sim.plan`` decorates its facts with.

In: a method of one argument (the instance). Out: ``cached_property``, functools' without its lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

_T = TypeVar("_T")


class cached_property(Generic[_T]):  # noqa: N801 (named as functools' is)
    """functools.cached_property without its lock: a fact computed on first use and kept in the instance's
    ``__dict__``, where later reads find it before this descriptor. Python 3.11's version takes an RLock on every
    first use (removed in 3.12), and the screen of ``sim search`` builds a Plan per layout, reading some 30 facts
    of each once: the lock cost about 7% of the screen. A Plan is not shared between threads while it is being
    resolved."""

    def __init__(self, func: Callable[[Any], _T]) -> None:
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> cached_property[_T]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> _T: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> _T | cached_property[_T]:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.func(instance)
        return value
