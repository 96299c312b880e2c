"""What the APIs accept as text. Every string a request body or form gives /api/v1 or popcorn (names, codes,
reasons) is `Text`: one the database cannot hold is refused at the door, a 400 naming the field, before any lookup
or write. PostgreSQL would refuse a NUL byte only once the query was sent, SQLite would silently match nothing, and
a lone surrogate (valid JSON, "\\ud800") cannot be encoded for either. Paths and query strings: kernelbot.middleware."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, StrictBool, StrictFloat, StrictInt, ValidationInfo

from .errors import Refused


def check_storable(field: str, value: str) -> str:
    """The same door for text that does not come through a schema (forms, Slack's commands): Refused, a 400."""
    if "\x00" in value:
        raise Refused(f"'{field}' holds a NUL byte, which no name, text or path can contain.")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise Refused(f"'{field}' holds a character that cannot be stored (a lone surrogate).") from None
    return value


def storable(value: str, info: ValidationInfo) -> str:
    # Refused, not ValueError: pydantic lets it through, so it is a 400 on both APIs (not a 422)
    return check_storable(info.field_name, value)


Text = Annotated[str, AfterValidator(storable)]
# Numbers and booleans as JSON sends them: pydantic's lax mode would read "2" and true as the GPU count 2 and 1, and
# "yes" as a flag. Every integer, boolean and float field of a request body is one of these (query parameters arrive as
# text and stay lax).
Int, Bool, Float = StrictInt, StrictBool, StrictFloat
