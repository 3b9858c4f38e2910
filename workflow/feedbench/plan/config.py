"""A config as data: read its files, bound its size, check it against config/schema.yaml; its errors
(ConfigError).

Snakemake reads `--configfile` files itself, before the Snakefile runs, and
its YTE templating evaluates the `?` expressions of a file that sets
`__use_yte__: true` as it reads it: such a config is code. The workflow reads
its default config with read_config_file before Snakemake does, so a syntax
error names file, line and column and templating is refused before it runs;
files given with `--configfile` are checked the same way afterwards (docs/knobs.md:
"Configs are code?"). Every error is one line, `<key path>: <what>; allowed:
<what>`, bounded in length whatever the config holds (YAML aliases can make a
few lines stand for billions of values).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
from typing import NoReturn

import yaml
from jsonschema import Draft202012Validator, validators

from ..core.knobs import ConfigError, key_path, shown

# Values (mappings, lists and scalars; an alias counts each time it is used) a config may hold.
MAX_VALUES = 100_000
# Characters of an error line: the longest one names a column among the summary's few dozen.
MAX_MESSAGE = 2_000


def read_config_file(path: str, read_by_snakemake: bool = False) -> dict:
    """The config in one file (JSON or YAML, as Snakemake reads it), or ConfigError naming file,
    line and column.

    read_by_snakemake: the file came with --configfile, so Snakemake has read it (and run its
    templates) already.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(
            f"{path}: cannot be read ({error}); allowed: a readable YAML or JSON file"
        ) from None
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = yaml.safe_load(text)
        except yaml.MarkedYAMLError as error:
            mark = error.problem_mark or error.context_mark
            where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else path
            what = ": ".join(part for part in (error.context, error.problem) if part)
            raise ConfigError(f"{where}: {what}; allowed: YAML (or JSON)") from None
        except yaml.YAMLError as error:
            raise ConfigError(
                f"{path}: {str(error).splitlines()[0]}; allowed: YAML (or JSON)"
            ) from None
    count_values(data, path)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: value {shown(data)} is not a mapping; allowed: a mapping of config keys"
        )
    if "__use_yte__" in data:
        raise ConfigError(
            f"{path}: __use_yte__: YTE templates run Python code in the config"
            + (
                " (Snakemake has run them already, reading --configfile)"
                if read_by_snakemake
                else ""
            )
            + "; allowed: plain YAML without __use_yte__"
        )
    return data


def typed_overrides(config: dict, overrides: dict, depth: int = 0) -> None:
    """The nested values of `--config` typed as the same YAML in a config file would be, in place.

    Snakemake reads `--config key=value` with YAML's base loader, which leaves every scalar below
    the top level a string: `target={cores_per_gpu: 4}` gives '4', which the schema would refuse as
    the wrong type. Each such string still in `config` (a config file's value merged under it is
    left alone) is read again with yaml.safe_load (4, 1.0, true; 'K80' stays 'K80')."""
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            typed_overrides(config[key], value, depth + 1)
        elif depth and isinstance(value, (str, list)) and config.get(key) == value:
            config[key] = _as_yaml_types(value)


def _as_yaml_types(value):
    """A number, boolean or null as YAML reads it; any other string stays the text it was ('a: b' is
    no mapping)."""
    if isinstance(value, list):
        return [_as_yaml_types(v) for v in value]
    if not isinstance(value, str) or not value.strip():
        return value
    try:
        typed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    return typed if typed is None or isinstance(typed, (bool, int, float)) else value


def count_values(config, where: str = "config", limit: int = MAX_VALUES) -> None:
    """Refuse a config of more than `limit` values, counting every use of a YAML alias, and stop
    counting there."""
    todo, count = [config], 0
    while todo:
        value = todo.pop()
        count += 1
        if count > limit:
            raise ConfigError(
                f"{where}: more than {limit} values (a YAML alias counts each time it is used); "
                f"allowed: at most {limit}"
            )
        if isinstance(value, dict):
            todo.extend(value.values())
        elif isinstance(value, list):
            todo.extend(value)


def _with_defaults(validator_class):
    """A validator that fills in each property's `default`, as snakemake.utils.validate does
    (jsonschema's FAQ)."""
    check_properties = validator_class.VALIDATORS["properties"]

    def properties(validator, props, instance, schema):
        if isinstance(instance, dict):
            for name, sub in props.items():
                if "default" in sub:
                    instance.setdefault(name, copy.deepcopy(sub["default"]))
        yield from check_properties(validator, props, instance, schema)

    return validators.extend(validator_class, {"properties": properties})


def validate_config(config: dict, schema_path: str) -> None:
    """Check the config against the schema and fill in its defaults; the first error as one line.

    jsonschema directly, not snakemake.utils.validate, whose error prints the whole config.
    """
    with open(schema_path, encoding="utf-8") as f:
        schema = yaml.safe_load(f)
    error = next(iter(_with_defaults(Draft202012Validator)(schema).iter_errors(config)), None)
    if error is not None:
        raise ConfigError(schema_error(error))


def schema_error(error) -> str:
    """One line from a jsonschema ValidationError: key path, value, what is allowed."""
    path = key_path(*error.absolute_path) if error.absolute_path else ""
    kind, value = error.validator, error.instance
    if kind == "pattern":  # the schema's only pattern: names that become folders and file names
        what = "name" if "propertyNames" in error.relative_schema_path else "value"
        return (
            f"{path}: {what} {shown(value)} is not fit for a path; allowed: letters, "
            "digits, _ and - (not first)"
        )
    if "propertyNames" in error.relative_schema_path and kind == "maxLength":
        return (
            f"{path}: name {shown(value)} has {len(value)} characters; allowed: at most "
            f"{error.validator_value}"
        )
    if kind in ("oneOf", "anyOf") and error.context:
        # The branch that fits the value's shape says what is wrong (a spec vs a list of specs, a
        # name vs a mapping).
        shaped = [e for e in error.context if _fits(error.validator_value[e.schema_path[0]], value)]
        fitting = [e for e in shaped or error.context if e.validator != "type" or e.relative_path]
        return schema_error(max(fitting or error.context, key=lambda e: len(e.absolute_path)))
    if kind in ("additionalProperties", "unevaluatedProperties"):
        known = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(value) - set(known)) if isinstance(value, dict) else []
        where = key_path(path, unknown[0]) if unknown else path or "config"
        return f"{where}: unknown key; allowed: {', '.join(known) or 'no keys'}"
    path = path or "config"
    if kind == "type":
        allowed = (
            "a non-empty list of levels"
            if len(error.absolute_path) == 4 and error.absolute_path[2] == "matrix"
            else _type_text(error.validator_value)
        )
        return f"{path}: value {shown(value)} has the wrong type; allowed: {allowed}"
    if kind == "enum":
        return (
            f"{path}: value {shown(value)} is not allowed; allowed: "
            f"{', '.join(map(str, error.validator_value))}"
        )
    if kind in ("minItems", "minProperties"):
        what = "no levels" if "matrix" in path else "too few entries"
        return f"{path}: value {shown(value)} has {what}; allowed: at least {error.validator_value}"
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        bound = {
            "minimum": ">=",
            "maximum": "<=",
            "exclusiveMinimum": ">",
            "exclusiveMaximum": "<",
        }[kind]
        return (
            f"{path}: value {shown(value)} is out of range; allowed: {bound} "
            f"{error.validator_value}"
        )
    if kind == "minLength":
        return (
            f"{path}: value {shown(value)} is too short; allowed: at least "
            f"{error.validator_value} characters"
        )
    if kind == "required":
        return f"{path}: missing key; allowed: a mapping with {', '.join(error.validator_value)}"
    return f"{path}: {error.message.splitlines()[0]}"


_SHAPES = {"object": dict, "array": list, "string": str}


def _fits(branch: dict, value) -> bool:
    """Whether a oneOf branch is for values of `value`'s shape: its `type`, or an enum of plain
    values."""
    if "type" in branch and branch["type"] in _SHAPES:
        return isinstance(value, _SHAPES[branch["type"]])
    if "enum" in branch:
        return not isinstance(value, (dict, list))
    return True


def _type_text(types) -> str:
    names = {
        "integer": "an integer",
        "number": "a number",
        "string": "a string",
        "boolean": "true or false",
        "object": "a mapping",
        "array": "a list",
        "null": "null",
    }
    types = types if isinstance(types, list) else [types]
    return " or ".join(names.get(t, t) for t in types)


def one_line(error: Exception) -> str:
    """`bad config: <message>`, on one line and at most MAX_MESSAGE characters long."""
    line = "bad config: " + " ".join(str(error).split("\n"))
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 3] + "..."


def stop(message: str) -> NoReturn:
    """End the run with `message` alone on stderr and exit status 1, before any job: a
    WorkflowError raised while Snakemake reads the Snakefile prints it inside `WorkflowError in
    file .../common.smk, line 70:` and two `File` lines, so that a config error read like a crash.
    SystemExit passes through Snakemake's clean-up, so its lock is released as after a
    WorkflowError."""
    print(message, file=sys.stderr)
    sys.exit(1)


def sized(config: dict) -> dict:
    """`size: small` deep-merges the config's `small` fragment over it (dicts merge, lists and
    scalars replace).

    A preset runs at its study's size by default; `--config size=small` runs the
    same experiments small enough for a CPU in minutes. The merge comes before
    validation, so the small config is checked like any other.
    """
    from snakemake.utils import update_config

    if config.get("size", "full") == "small" and isinstance(config.get("small"), dict):
        update_config(config, copy.deepcopy(config["small"]))
    return config


def config_dir(key: str, configfiles: list) -> str:
    """The folder of the last config file that sets `key` (its paths are relative to it); else the
    working directory."""
    for path in reversed(configfiles):
        try:
            if key in read_config_file(str(path)):
                return os.path.dirname(os.path.abspath(str(path)))
        except ConfigError:
            continue
    return os.getcwd()


def config_hash(config: dict) -> str:
    """sha256 of the validated config (defaults filled in): names the run in the report."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
