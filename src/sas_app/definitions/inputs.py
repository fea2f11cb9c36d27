"""A workflow's typed input: ``Workflow(..., input=Order)``, a pydantic (v2) model.

The payload is validated against it on every way in — ``submit``, ``submit_many``, the broker's
``sas.submit``, a schedule's ticks, a child run's start, an operator's edited input — and stored as
the model dumps it (defaults filled in, values as JSON), so that every process reads the same
payload. An agent's action gets the parsed model as ``call.payload``. A payload that does not
validate is refused with every bad field named, and nothing is written.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError


def is_model(value: Any) -> bool:
    """``value`` is a pydantic model class."""
    return isinstance(value, type) and issubclass(value, BaseModel)


def problems(exc: ValidationError) -> str:
    """Each bad field and what is wrong with it: ``amount: Input should be greater than 0;
    items.0.sku: Field required``."""
    return "; ".join(f"{'.'.join(str(part) for part in error['loc']) or '(the payload)'}: {error['msg']}"
                     for error in exc.errors(include_url=False))


def stored_input(model: type[BaseModel], payload: Any) -> Any:
    """``payload`` validated against ``model``, as the store keeps it (the model's JSON dump, by
    alias: what its JSON Schema describes and what it validates again); ``ValueError`` naming
    every bad field when it does not validate."""
    return parsed_input(model, payload).model_dump(mode="json", by_alias=True)


def parsed_input(model: type[BaseModel], payload: Any) -> BaseModel:
    """``payload`` as ``model`` (what an action gets); ``ValueError`` naming every bad field when
    it does not validate (or a validator of the model raised something else)."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise ValueError(f"the payload is not a valid {model.__name__}: {problems(exc)}") from None
    except Exception as exc:  # a validator's own bug: still a refusal, never a retry of the submission
        raise ValueError(f"the payload could not be validated as a {model.__name__}: {type(exc).__name__}: "
                         f"{exc}") from None


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON Schema (what the dashboard's workflow page and the docs show)."""
    return model.model_json_schema()
