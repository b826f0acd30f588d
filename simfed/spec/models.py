"""A base for small pydantic v2 models outside the scenario schema (sweep files, the testbed's
spec, bench rows): frozen, unknown keys refused, and a mistake raised as a SpecError of ONE line
that names the key path and the value, as everywhere else in simfed."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from .schema import SpecError


class FrozenModel(BaseModel):
    """Frozen, extra="forbid"; constructing one with a bad field raises SpecError (one line)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
    error: ClassVar[type[Exception]] = SpecError  # what a mistake raises (one line)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise self.error(one_line(exc, type(self))) from None

    # Nested models are validated by pydantic-core directly, not through this __init__, so an
    # error deep inside keeps its whole key path (pydantic's own BaseModel and RootModel mark
    # their __init__ the same way).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def parse(cls, data: Any, where: str = "") -> Any:
        """Validate plain data (parsed YAML/JSON); SpecError prefixed by `where` on a mistake."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            msg = one_line(exc, cls)
            raise cls.error(f"{where}: {msg}" if where else msg) from None


def _child(model: type[BaseModel] | None, part: Any) -> type[BaseModel] | None:
    if model is None or isinstance(part, int):
        return model  # a list item: the list's item model, when it is one (see _item_model)
    for name, f in model.model_fields.items():
        if part in (name, f.alias):
            return _item_model(f.annotation)
    return None


def _item_model(tp: Any) -> type[BaseModel] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    for arg in getattr(tp, "__args__", ()):  # list[M], tuple[M, ...], M | None
        found = _item_model(arg)
        if found is not None:
            return found
    return None


def one_line(exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """pydantic's first error as one line: the dotted key path ([i] for list items), the reason
    and the value. With the model, an unknown key lists the valid ones and a missing one says
    what it is (the field's description)."""
    err = exc.errors(include_url=False)[0]
    loc = err["loc"]
    path = ""
    for part in loc:
        path = f"{path}[{part}]" if isinstance(part, int) else (
            f"{path}.{part}" if path else str(part))
    msg = err["msg"]
    if msg.startswith(("Value error, ", "Assertion failed, ")):
        msg = msg.split(", ", 1)[1]  # a validator's own message names what it checked
        return f"{path}: {msg}" if loc else msg
    parent = model
    for part in loc[:-1]:
        parent = _child(parent, part)
    if err["type"] == "extra_forbidden":
        valid = sorted((f.alias or n) for n, f in parent.model_fields.items()) if parent else []
        return f"{path}: unknown key" + (f"; valid keys: {', '.join(valid)}" if valid else "")
    if err["type"] == "missing":
        field = None
        if parent is not None:
            field = next((f for n, f in parent.model_fields.items()
                          if loc[-1] in (n, f.alias)), None)
        what = f" ({field.description})" if field is not None and field.description else ""
        return f"{path}: required{what}"
    shown = repr(err.get("input"))
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"{path}: {msg[0].lower()}{msg[1:]}, got {shown}"
