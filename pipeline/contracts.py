"""Typed contracts between the layers: `DatasetInfo` (what a converted dataset holds) and `DataMap` (images
and their categories, as `imagenet_partition` returns them and `convert` takes them).

Both are frozen dataclasses whose fields a type checker sees (``info.rows``; a typo is an attribute error)
and also read-only mappings with the keys of the JSON they come from (``info["rows"]``, ``info.get("resized")``,
``"class_rows" in info``, ``dict(info)``), the access the user guide documents. Their lists and dicts are
`FrozenList` / `FrozenDict`: equal to, printed as and JSON-serialised as plain lists and dicts, but refusing
any change, so one reader cannot alter what another reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NoReturn

from .errors import InvalidPipelineInput


def _refuse(self, *args, **kwargs) -> NoReturn:
    raise TypeError(f"{type(self).__name__} is read-only")


class FrozenList(list):
    """A list that refuses changes (equal to, printed and JSON-serialised as a plain list)."""

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __hash__(self):   # type: ignore[override]
        return hash(tuple(self))

    def __reduce_ex__(self, protocol):
        return type(self), (list(self),)


class FrozenDict(dict):
    """A dict that refuses changes (equal to, printed and JSON-serialised as a plain dict)."""

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = _refuse
    pop = popitem = clear = update = setdefault = _refuse

    def __reduce_ex__(self, protocol):
        return type(self), (dict(self),)


def freeze(value):
    """`value` with every list (or tuple) a `FrozenList` and every dict a `FrozenDict`, all the way down."""
    if isinstance(value, FrozenList | FrozenDict):
        return value
    if isinstance(value, Mapping):
        return FrozenDict({key: freeze(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return FrozenList(freeze(item) for item in value)
    return value


def thaw(value):
    """A plain (mutable) copy of `value`: lists and dicts all the way down."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(item) for item in value]
    return value


class _Contract(Mapping):
    """A frozen dataclass that is also a read-only mapping of the keys it was built from."""

    _keys: tuple[str, ...]
    extra: Mapping[str, Any]

    def _fields(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self) if f.name not in ("extra", "_keys"))  # type: ignore[arg-type]

    def _settle(self) -> None:
        """Freeze every value; the keys are the fields given (not None) and `extra`'s, unless set."""
        for name in self._fields():
            object.__setattr__(self, name, freeze(getattr(self, name)))
        object.__setattr__(self, "extra", freeze(self.extra or {}))
        if not self._keys:
            keys = tuple(name for name in self._fields() if getattr(self, name) is not None)
            object.__setattr__(self, "_keys", keys + tuple(k for k in self.extra if k not in keys))

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys:
            raise KeyError(key)
        return self.extra[key] if key in self.extra else getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self) -> dict:
        """A plain, mutable JSON-shaped copy (lists and dicts all the way down)."""
        return thaw(dict(self.items()))

    @classmethod
    def _from(cls, data: Mapping[str, Any]):
        names = {f.name for f in fields(cls) if f.name not in ("extra", "_keys")}  # type: ignore[arg-type]
        known = {key: value for key, value in data.items() if key in names}
        extra = {key: value for key, value in data.items() if key not in names}
        make: Any = cls   # a dataclass below this one: its fields are the keyword arguments
        return make(**known, extra=extra, _keys=tuple(data))


@dataclass(frozen=True, eq=False)
class DatasetInfo(_Contract):
    """What a converted dataset holds (`dataset_info`, `read_info`), read from its ``_common_metadata``.

    Read its fields (``info.rows``) or, as the user guide shows, its keys (``info["rows"]``,
    ``info.get("resized")``, ``dict(info)``): the keys are those of the dataset's JSON (a dataset written
    by an older pinstorm may lack some), the fields have a value (a default) for each. ``to_dict()``
    gives a plain copy to change or serialise.

    Args:
        rows: Rows (images) in the dataset.
        row_groups: Row groups in all parts together.
        row_group_rows: Rows of each row group, in part order.
        files: Part name -> its entry (``rows``, ``row_groups``, ``bytes``, checksums).
        num_classes: Classes, hence labels ``0 .. num_classes - 1``.
        classes: The class ids (wnids) in label order.
        names: Class id -> human-readable name.
        class_rows: Rows of each class, in label order (None in older datasets).
        bytes: Bytes of all parts together.
        format: The metadata's format version (None before versions were recorded).
        split: ``train`` or ``val``, as converted.
        partitions: How many parts.
        skipped: Images left out (undecodable).
        reencoded: Images stored re-encoded (not JPEG, CMYK, rotated, downscaled).
        empty_classes: Classes without a row.
        reoriented: Images turned upright by their EXIF orientation.
        resized: Images downscaled to ``max_side``.
        checksum: The checksum algorithm of the parts (``xxh3_64``).
        seed: The seed that ordered the rows (None: no shuffle seed given).
        plan: The digest of the conversion's inputs and settings.
        source: What was converted, in words.
        created: When the conversion finished (ISO 8601).
        url: Where the dataset was read from (set by `dataset_info`).
        extra: Keys of the JSON this pinstorm does not know, kept as they are.
        _keys: The keys of the mapping, in order (by default: the fields not None, then `extra`'s).
    """

    rows: int
    row_groups: int
    row_group_rows: Sequence[int]
    files: Mapping[str, Mapping[str, Any]]
    num_classes: int = 0
    classes: Sequence[str] = ()
    names: Mapping[str, str] = field(default_factory=dict)
    class_rows: Sequence[int] | None = None
    bytes: int = 0
    format: int | None = None
    split: str | None = None
    partitions: int | None = None
    skipped: int | None = None
    reencoded: int | None = None
    empty_classes: Sequence[str] | None = None
    reoriented: int | None = None
    resized: int | None = None
    checksum: str | None = None
    seed: int | None = None
    plan: str | None = None
    source: str | None = None
    created: str | None = None
    url: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    _keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self._settle()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DatasetInfo:
        """A `DatasetInfo` of the JSON `data`, already checked (`check_info`), with exactly its keys.

        Args:
            data: The dataset's pinstorm JSON.

        Returns:
            The frozen info.
        """
        if isinstance(data, DatasetInfo):
            return data
        known = dict(data)
        if "num_classes" not in known:
            known["num_classes"] = len(known.get("classes") or ())
        info = cls._from(known)
        object.__setattr__(info, "_keys", tuple(data))
        return info

    def with_changes(self, **changes: Any) -> DatasetInfo:
        """A copy with `changes` (fields), each then also a key of the mapping.

        Args:
            **changes: Field name -> new value.

        Returns:
            The new frozen info.
        """
        data = dict(self.items())
        data.update(changes)
        return type(self)._from(data)


@dataclass(frozen=True, eq=False)
class DataMap(_Contract):
    """Images and their categories, to convert: what `imagenet_partition` returns and `convert` takes.

    `convert` takes a plain dict with the same keys too (``{"image": [...], "category": [...]}``);
    `DataMap.from_source` recognises either. Read as fields (``data.image``) or keys (``data["image"]``).

    Args:
        image: The image files' paths.
        category: Each image's class id (wnid), one per image.
        categories: The class ids this slice covers (its own categories), or None.
        classes: Every class id, in label order (so that slices agree on labels), or None.
        names: Class id -> human-readable name, or None.
        extra: Other keys, kept as they are.
        _keys: The keys of the mapping, in order (by default: the fields not None, then `extra`'s).
    """

    image: Sequence[str]
    category: Sequence[str]
    categories: Sequence[str] | None = None
    classes: Sequence[str] | None = None
    names: Mapping[str, str] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    _keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "image", [os.fspath(p) for p in self.image])
        object.__setattr__(self, "category", [str(c) for c in self.category])
        if len(self.image) != len(self.category):
            raise InvalidPipelineInput(f"data map: {len(self.image)} images but {len(self.category)} categories")
        self._settle()

    @staticmethod
    def is_data_map(source: object) -> bool:
        """Whether `source` is a data map: a `DataMap`, or a mapping with ``image`` and ``category`` keys.

        Args:
            source: Anything.

        Returns:
            True for a data map.
        """
        return isinstance(source, DataMap) or (isinstance(source, Mapping) and "image" in source
                                               and "category" in source)

    @classmethod
    def from_source(cls, source: object) -> DataMap | None:
        """`source` as a `DataMap` when it is a data map (`is_data_map`), else None.

        Args:
            source: A `DataMap`, a dict with keys ``image`` and ``category`` (and maybe ``categories``,
                ``classes``, ``names``), or anything else.

        Returns:
            The data map, or None when `source` is none.

        Raises:
            InvalidPipelineInput: A data map with other than one category per image.
        """
        if isinstance(source, DataMap):
            return source
        if not cls.is_data_map(source):
            return None
        assert isinstance(source, Mapping)
        return cls._from(source)

    def label_classes(self) -> list[str]:
        """The class ids that fix the labels: ``classes`` (all of them), else ``categories``, else none."""
        return list(self.classes or self.categories or [])
