"""Reading one setting's value from the environment: numbers, booleans, choices, each with
an error that names the variable and says what it takes."""
from typing import Any, Callable, Mapping, Tuple


def read_number(env: Mapping[str, str], key: str, default: Any, parse: Callable[[str], Any],
                what: str) -> Any:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        return parse(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not {what}") from None


def read_bytes(env: Mapping[str, str], key: str, default: int) -> int:
    value = read_number(env, key, default, int, "an integer number of bytes")
    if value < 0:
        raise ValueError(f"{key}={env[key]!r} must be >= 0")
    return value


def read_ms(env: Mapping[str, str], key: str, default: float) -> float:
    value = read_number(env, key, default, float, "a number of milliseconds")
    if not value > 0 or value > 60_000:
        raise ValueError(f"{key}={env[key]!r} must be more than 0 and at most 60000 milliseconds")
    return value


def read_seconds(env: Mapping[str, str], key: str, default: float, zero: bool) -> float:
    value = read_number(env, key, default, float, "a number of seconds")
    if value < 0 or (value == 0 and not zero) or value != value:
        least = ">= 0 (0: never)" if zero else "more than 0"
        raise ValueError(f"{key}={env[key]!r} must be {least} seconds")
    return value


def read_count(env: Mapping[str, str], key: str, default: int, least: int) -> int:
    value = read_number(env, key, default, int, "a whole number")
    if value < least:
        raise ValueError(f"{key}={env[key]!r} must be at least {least}")
    return value


def read_log_level(env: Mapping[str, str]) -> str:
    from .log import LEVELS

    raw = (env.get("HVDLIKE_LOG_LEVEL") or "warning").lower()
    if raw not in LEVELS:
        raise ValueError(f"HVDLIKE_LOG_LEVEL={env['HVDLIKE_LOG_LEVEL']!r} is not one of "
                         + ", ".join(LEVELS))
    return raw


def read_choice(env: Mapping[str, str], key: str, choices: Tuple[str, ...]) -> str:
    raw = (env.get(key) or choices[0]).lower()
    if raw not in choices:
        raise ValueError(f"{key}={env[key]!r} is not one of " + ", ".join(choices))
    return raw


def read_bool_or_auto(env: Mapping[str, str], key: str, default: str) -> str:
    """The value as "1", "0" or "auto" (a boolean, or auto)."""
    raw = (env.get(key) or "").lower()
    if raw == "auto":
        return raw
    try:
        return "1" if read_bool(env, key, default == "1") else "0"
    except ValueError:
        raise ValueError(f"{key}={env[key]!r} is not a boolean or auto; use 1, 0 or auto") \
            from None


def read_bool(env: Mapping[str, str], key: str, default: bool) -> bool:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{key}={raw!r} is not a boolean; use 1 or 0")
