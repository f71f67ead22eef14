"""``pytree_dataclass``: a frozen dataclass registered as a JAX pytree, whose tree definition names
its class.

``jax.tree_util.register_dataclass`` (jaxlib 0.10) makes tree definitions that compare EQUAL for
two classes with the same number of data fields and the same static fields (``DistanceBias`` and
``ToeplitzCos``: two arrays each), though their hashes differ. A cache of compiled programs keyed by
the tree definition can then hand one class's program to the other whenever their hashes meet in
a bucket: seldom, and silently (a reproduce run once computed E5's Toeplitz cosine factor with the
distance bias's program). Registered here instead, a node's definition holds its class, so the
definitions of two classes never compare equal (``tests/test_pytree.py``).

``data_fields`` are the children (arrays, traced), ``meta_fields`` the static auxiliary data
(hashable); an instance is rebuilt without calling ``__init__`` (as JAX does for its own
dataclasses), so validation in ``__post_init__`` runs only where a user makes one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
from jax.tree_util import GetAttrKey


def pytree_dataclass(*, data_fields: Sequence[str], meta_fields: Sequence[str]):
    """A class decorator (put it above ``@dataclasses.dataclass(frozen=True)``) registering the
    dataclass as a pytree with these data (children) and meta (static) fields."""
    data, meta = tuple(data_fields), tuple(meta_fields)

    def register(cls):
        def flatten_with_keys(obj):
            children = [(GetAttrKey(name), getattr(obj, name)) for name in data]
            return children, tuple(getattr(obj, name) for name in meta)

        def flatten(obj):
            return [getattr(obj, name) for name in data], tuple(getattr(obj, name) for name in meta)

        def unflatten(aux, children):
            obj = object.__new__(cls)
            for name, value in (*zip(meta, aux, strict=True), *zip(data, children, strict=True)):
                object.__setattr__(obj, name, value)
            return obj

        jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
        return cls

    return register


class ByIdentity:
    """A value held as static pytree data and compared by identity (arrays are not hashable): its
    program is reused only for the same object, which the holder keeps alive."""

    __slots__ = ("value",)

    def __init__(self, value) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByIdentity) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def pytree_field(*, data_fields: Sequence[str]):
    """A class decorator registering a frozen dataclass *vector field* as a pytree: ``data_fields``
    (the kernel, the heads) are its children and every other ``__init__`` field is static, except
    where the instance's ``numbers_traceable`` is False (the expansion, whose degree is chosen from
    concrete numbers when it is made): then the data fields are static too, by identity."""
    data = tuple(data_fields)

    def register(cls):
        meta = tuple(f.name for f in dataclasses.fields(cls) if f.init and f.name not in data)

        def flatten(obj):
            statics = tuple(getattr(obj, name) for name in meta)
            if getattr(obj, "numbers_traceable", True):
                return [getattr(obj, name) for name in data], (True, statics)
            return [], (False, statics + tuple(ByIdentity(getattr(obj, name)) for name in data))

        def unflatten(aux, children):
            traceable, statics = aux
            if not traceable:
                statics, children = statics[: len(meta)], [held.value for held in statics[len(meta) :]]
            obj = object.__new__(cls)
            for name, value in (*zip(meta, statics, strict=True), *zip(data, children, strict=True)):
                object.__setattr__(obj, name, value)
            return obj

        jax.tree_util.register_pytree_node(cls, flatten, unflatten)
        cls.pytree_data_fields = data  # a subclass registers itself with these (tests' mutants)
        return cls

    return register
