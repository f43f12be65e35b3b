"""Whether an AUTOCLUSTERS_* variable names one of the API's (and so the shared) settings:
AUTOCLUSTERS_CLUSTER a field, AUTOCLUSTERS_TEMPORAL__ADDRESS a field of a group."""

from __future__ import annotations

from typing import get_args

from pydantic import BaseModel

from autoclusters.clients.web.settings import ApiSettings


def names_a_setting(var: str, model: type[BaseModel] = ApiSettings) -> bool:
    first, _, rest = var.removeprefix("AUTOCLUSTERS_").lower().partition("__")
    field = model.model_fields.get(first)
    if field is None:
        return False
    if not rest:
        return True
    # A group (TemporalSettings) or an optional one (SlackConfig | None).
    for t in (field.annotation, *get_args(field.annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return names_a_setting(rest.upper(), t)
    return False
