"""Click types shared by simfed's command lines."""

from __future__ import annotations

from typing import Any

import click


class NonEmptyPath(click.Path):
    """click.Path that refuses an empty string: with path_type=Path it became '.', the current
    folder, and an empty output path was taken as 'not given' (the default name written)."""

    name = "path"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, (str, bytes)) and not value:
            self.fail("an empty path", param, ctx)
        return super().convert(value, param, ctx)
