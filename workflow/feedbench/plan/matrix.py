"""From a validated config to the list of cells the workflow runs.

An experiment is a `base` (fixed knobs), a `matrix` (axes -> levels, whose
Cartesian product gives the cells), an optional `exclude` (partial mappings
that remove matching product cells) and an optional `include` (extra cells,
added after the exclusions). Every cell starts from the config's `defaults`.

A cell id names the knobs that vary in its experiment, `<knob>-<value>_...`:
the matrix axes in the order written, then, for an include, the knobs it sets
beyond the axes (sorted). Adding a level to an axis therefore never changes
the id of an existing cell. The experiment's baseline is its first cell: the
first level of every axis (or the first include when there is no matrix).

Every value is checked against the knob table (feedbench.core.knobs) before the
product is formed, and every expanded cell by the parse the harness runs too
(feedbench.core.cell.parse_cell), so the workflow and the harness cannot disagree;
errors come back as one line naming the config key path the value came from.
The size of the matrix (`max_cells`) and the columns plots name are checked
before any cell is expanded or any job runs.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import itertools
import math
import os
import re
from dataclasses import replace
from typing import Any

from ..core import command
from ..core.ceilings import Bounds, ceiling_cells
from ..core.columns import STAGE_COLUMN, SUMMARY_COLUMNS
from ..core.cpu_speed import with_speed_file
from ..core.knobs import KNOBS, ConfigError, KnobError, key_path, shown, user_code_of
from ..core.planned_cell import (
    ARG_KNOBS,
    NOT_KNOBS,
    PERIODIC_REPEATS,
    PlannedCell,
    arg_key,
    cell_id,
    default_of,
    effective,
    fold_args,
    periodic,
    same_key,
    same_value,
)
from ..core.search import check as check_search
from ..core.search import dry_run_line
from ..core.target import check_cells, measured_cells, read_target
from .config import config_dir, count_values, sized, validate_config

# A name fit for a folder: also the pattern (and maxLength) of config/schema.yaml's experiment
# names.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]*"
MAX_NAME_LENGTH = 64
# Cells of all experiments together, unless the config's `max_cells` says otherwise
# (config/schema.yaml).
MAX_CELLS = 10_000


def check_name(name: Any) -> None:
    """An experiment name is a folder and a wildcard value: short, plain, and not periodic."""
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise ConfigError(
            f"experiments: name {shown(name)} is not fit for a path; allowed: letters, digits, _ "
            "and - (not first)"
        )
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigError(
            f"experiments: name {shown(name)} has {len(name)} characters; allowed: at most "
            f"{MAX_NAME_LENGTH}"
        )
    if periodic(name):
        raise ConfigError(
            f"experiments: name {name!r} ends in a part repeated {PERIODIC_REPEATS} times or more,"
            " which Snakemake refuses as a wildcard; allowed: a name without such a repeat"
        )


def knob_error(error: KnobError, sources: dict[str, str]) -> ConfigError:
    """Rewrite the harness's `knob 'x': ...` as `<key path of x>: ...`."""
    message = str(error)
    match = re.match(r"knob '(\w+)': (.*)$", message)
    if match and match.group(1) in sources:
        return ConfigError(f"{sources[match.group(1)]}: {match.group(2)}")
    return ConfigError(f"{next(iter(sources.values()), 'config')}: {message}")


def check_names(mapping: dict, where: str, extra: tuple[str, ...] = ()) -> None:
    """Every key of a knob mapping must be a knob of the harness (KNOBS)."""
    for name in mapping:
        if name not in KNOBS and name not in extra and not arg_key(name):
            allowed = sorted(KNOBS) + list(extra)
            close = difflib.get_close_matches(str(name), allowed, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(
                f"{key_path(where, name)}: unknown knob{hint}; allowed: {', '.join(allowed)}"
            )


def check_values(mapping: dict, where: str) -> None:
    """Every value of a knob mapping passes the knob table's check (type, range, finite)."""
    for name, value in mapping.items():
        if name in KNOBS and not arg_key(name):
            try:
                KNOBS[name].check(value)
            except KnobError as error:
                raise knob_error(error, {name: key_path(where, name)}) from None


def check_levels(axis: str, levels: list, where: str) -> None:
    """An axis's levels are valid and differ by value: [1, 1.0] or [true, true] would run one cell
    twice."""
    seen: dict[str, Any] = {}
    for level in levels:
        try:
            value = level if arg_key(axis) else KNOBS[axis].check(level)
        except KnobError as error:
            raise knob_error(error, {axis: where}) from None
        key = same_key(value)
        if key in seen:
            twice = (
                f" (as {shown(seen[key])} and {shown(level)})"
                if repr(seen[key]) != repr(level)
                else ""
            )
            raise ConfigError(
                f"{where}: value {shown(level)} is given twice{twice}; allowed: levels that differ"
            )
        seen[key] = level


def cell_count(experiment: dict) -> int:
    """Cells of an experiment before it is expanded: the product of its axes' lengths plus its
    includes (at least 1)."""
    axes = experiment.get("matrix") or {}
    product = (
        math.prod(len(levels) if isinstance(levels, list) else 1 for levels in axes.values())
        if axes
        else 0
    )
    return max(product + len(experiment.get("include") or []), 1)


def check_size(experiments: dict, limit: int) -> None:
    """Refuse more than `limit` cells before expanding them: a million cells would take minutes and
    gigabytes."""
    counts = {name: cell_count(experiment) for name, experiment in experiments.items()}
    total = sum(counts.values())
    if total > limit:
        largest = ", ".join(
            f"{name}: {count}" for name, count in sorted(counts.items(), key=lambda kv: -kv[1])[:3]
        )
        raise ConfigError(
            f"experiments: {total} cells ({largest}); allowed: at most {limit} "
            "cells in all (max_cells)"
        )


def as_written(mapping: dict) -> dict:
    """A knob mapping with each value as its author wrote it (Knob.as_written: `amp: off`, which
    YAML reads as false; `cache_after: none`, no cache), matrix levels too, so that the cells' ids
    and the harness read the same value."""
    return {
        k: [KNOBS[k].as_written(v) for v in value]
        if isinstance(value, list) and k in KNOBS and KNOBS[k].type is not list
        else KNOBS[k].as_written(value)
        if k in KNOBS
        else value
        for k, value in mapping.items()
    }


def experiment_as_written(experiment: dict) -> dict:
    """An experiment's base, matrix, exclusions and inclusions as_written."""
    return {
        **experiment,
        **{k: as_written(experiment[k]) for k in ("base", "matrix") if experiment.get(k)},
        **{
            k: [as_written(m) if isinstance(m, dict) else m for m in experiment[k]]
            for k in ("exclude", "include")
            if isinstance(experiment.get(k), list)
        },
    }


def expand_experiment(
    name: str, experiment: dict, defaults: dict, images_dir: str | None = None
) -> list[PlannedCell]:
    """The cells of one experiment, in order: the product (less exclusions), then the includes."""
    defaults, experiment = as_written(defaults), experiment_as_written(experiment)
    where = key_path("experiments", name)
    check_names(defaults, "defaults", NOT_KNOBS)
    check_values(defaults, "defaults")
    for key in ("base", "matrix"):
        check_names(experiment.get(key) or {}, key_path(where, key))
    check_values(experiment.get("base") or {}, key_path(where, "base"))
    for key in ("exclude", "include"):
        for i, mapping in enumerate(experiment.get(key) or []):
            check_names(mapping, key_path(where, key, i))
            check_values(mapping, key_path(where, key, i))
    base_knobs = {k: v for k, v in defaults.items() if k not in NOT_KNOBS}
    sources = {k: key_path("defaults", k) for k in base_knobs}
    base_knobs.update(experiment.get("base") or {})
    sources.update({k: key_path(where, "base", k) for k in experiment.get("base") or {}})
    axes = experiment.get("matrix") or {}
    for axis, levels in axes.items():
        if not isinstance(levels, list) or not levels:
            raise ConfigError(
                f"{key_path(where, 'matrix', axis)}: value {shown(levels)} has no levels; "
                "allowed: a non-empty list"
            )
        check_levels(axis, levels, key_path(where, "matrix", axis))
    # knobs, sources, id keys, include path
    raw: list[tuple[dict, dict, list[str], str | None]] = []
    if axes:
        for levels in itertools.product(*axes.values()):
            knobs = {**base_knobs, **dict(zip(axes, levels, strict=True))}
            raw.append(
                (
                    knobs,
                    {**sources, **{a: key_path(where, "matrix", a) for a in axes}},
                    list(axes),
                    None,
                )
            )
    excludes = experiment.get("exclude") or []
    for i, partial in enumerate(excludes):
        kept = [
            r
            for r in raw
            if not all(same_value(r[0].get(k, default_of(k)), v) for k, v in partial.items())
        ]
        if len(kept) == len(raw):
            raise ConfigError(
                f"{key_path(where, 'exclude', i)}: value {shown(partial)} matches no cell of the "
                "matrix; allowed: a mapping of axis levels"
            )
        raw = kept
    if axes and not any(
        all(same_value(r[0][a], levels[0]) for a, levels in axes.items()) for r in raw
    ):
        raise ConfigError(
            f"{key_path(where, 'exclude')}: removes the baseline (the first level of every "
            "axis); allowed: exclusions that keep it"
        )
    for i, extra in enumerate(experiment.get("include") or []):
        knobs = {**base_knobs, **extra}
        keys = list(axes) + sorted(k for k in extra if k not in axes)
        raw.append(
            (
                knobs,
                {**sources, **{k: key_path(where, "include", i, k) for k in extra}},
                keys,
                key_path(where, "include", i),
            )
        )
    if not raw:
        raw.append((base_knobs, sources, [], None))
    return _planned(name, where, raw, images_dir)


def _planned(
    name: str,
    where: str,
    raw: list[tuple[dict, dict, list[str], str | None]],
    images_dir: str | None,
) -> list[PlannedCell]:
    """The planned cells of an experiment's raw ones, args folded; ConfigError on two cells that are
    one."""
    cells: list[PlannedCell] = []
    seen: dict[str, tuple[dict, str]] = {}
    same: dict[str, str] = {}  # the cell's knobs as the harness reads them -> id
    for index, (knobs, knob_sources, keys, origin) in enumerate(raw):
        if images_dir and knobs.get("dataset") == "images" and not knobs.get("data_dir"):
            knobs = {**knobs, "data_dir": images_dir}
            knob_sources = {**knob_sources, "data_dir": "images"}
        ident = cell_id(knobs, keys)
        if ident in seen:
            first_knobs, first_origin = seen[ident]
            what = "duplicates" if first_knobs == knobs else "has the same id as"
            raise ConfigError(
                f"{origin or where}: {what} cell '{ident}' ({first_origin}); "
                "allowed: cells that differ"
            )
        knobs, knob_sources = command.from_defaults_only(knobs, knob_sources)
        folded, folded_sources = fold_args(knobs, knob_sources)
        key = same_key(effective(folded))
        if key in same:
            first = same[key]
            where_first = seen[first][1]
            raise ConfigError(
                f"{origin or where}: duplicates cell '{first}' ({where_first}); allowed: cells "
                "that differ"
            )
        seen[ident] = (knobs, origin or key_path(where, "matrix"))
        same[key] = ident
        cells.append(PlannedCell(name, ident, folded, folded_sources, baseline=index == 0))
    return cells


def check_cell(cell: PlannedCell, images_dir: str | None = None) -> PlannedCell:
    """Knob-level checks by the parse the harness runs too (core.cell.parse_cell), plus: a data_dir
    the user gave must exist.

    Returns the cell with `parsed` set: its Cell, so the workflow never parses it again."""
    from ..core.cell import parse_cell  # plain Python, no torch (the user's code may import it)
    from ..core.plugins import resolve_all

    try:
        parsed = parse_cell(cell.labelled(1))
        # importing the user's code (the config names it): a target that does not import stops here
        resolve_all(parsed)
        command.check_paths(cell.knobs)
    except KnobError as error:
        raise knob_error(error, cell.sources) from None
    data_dir = cell.knobs.get("data_dir")
    if (
        data_dir
        and data_dir != images_dir
        and not os.path.isdir(data_dir)
        and not cell.knobs.get("download")
    ):  # download makes it
        hint = (
            " (make one with: python -m feedbench make-images DIR, or leave data_dir out to "
            "generate one)"
            if cell.knobs.get("dataset") == "images"
            else ""
        )
        raise ConfigError(
            f"{cell.sources.get('data_dir', 'data_dir')}: value {shown(data_dir)} does not "
            f"exist; allowed: an existing folder{hint}"
        )
    return replace(cell, parsed=parsed)


def with_args_folder(cell: PlannedCell, folder: str | None) -> PlannedCell:
    """Paths written `./...` or `../...` in dataset_args and model_args made absolute against
    `folder` (the config file's), as python_path is: the jobs run in Snakemake's --directory,
    wherever that is. One that does not exist is a ConfigError naming its key, before any job. Other
    strings are left as they are: an argument may be no path. A command's workdir and a relative
    python likewise (core.command.with_folder)."""
    if folder is None:
        return cell
    knobs = dict(command.with_folder(cell.knobs, folder))
    for args_knob in ARG_KNOBS:
        args = dict(cell.knobs.get(args_knob) or {})
        for name, value in args.items():
            if isinstance(value, str) and value.startswith(("./", "../")):
                args[name] = os.path.normpath(os.path.join(folder, value))
                if not os.path.exists(args[name]):
                    where = cell.sources.get(args_knob, args_knob)
                    where += f".{name}" if where.endswith(args_knob) else f" ({args_knob}.{name})"
                    raise ConfigError(
                        f"{where}: path {shown(value)} does not exist (relative to the config "
                        f"file's folder, {folder}: {args[name]}); allowed: an existing path"
                    )
        if args != (cell.knobs.get(args_knob) or {}):
            knobs[args_knob] = args
    return replace(cell, knobs=knobs) if knobs != cell.knobs else cell


def with_python_path(cell: PlannedCell, python_path: list[str]) -> PlannedCell:
    """The config's python_path (absolute) on cells that name user code, and only on them: their
    params carry it."""
    if not python_path or not user_code_of(cell.knobs):
        return cell
    return replace(
        cell,
        knobs={**cell.knobs, "python_path": python_path},
        sources={**cell.sources, "python_path": "python_path"},
    )


def check_plots(name: str, experiment: dict, cells: list[PlannedCell]) -> None:
    """x, y and hue of every plot spec name a knob or a summary column (analysis.plots draws from
    the summary)."""
    plot = experiment.get("plot")
    if not plot:
        return
    if all(c.knobs.get("scenario", KNOBS["scenario"].default) == "transfer" for c in cells):
        # a transfer probe is drawn on its own axes, whatever the spec names
        # (feedbench.analysis.plots.draw)
        return
    where = key_path("experiments", name, "plot")
    specs = (
        [(key_path(where, i), spec) for i, spec in enumerate(plot)]
        if isinstance(plot, list)
        else [(where, plot)]
    )
    columns = SUMMARY_COLUMNS
    for where, spec in specs:
        names = {"x": spec.get("x"), "y": spec.get("y", "samples_per_s"), "hue": spec.get("hue")}
        if spec.get("kind") == "phases":
            del names["y"]  # phases draws the step's phases, not y
        for key, column in names.items():
            if (
                column is None
                or column in KNOBS
                or re.fullmatch(r"\w+_mean", column)
                or STAGE_COLUMN.fullmatch(column)
            ):
                continue
            if column in columns:
                continue
            close = difflib.get_close_matches(column, list(KNOBS) + columns, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(
                f"{key_path(where, key)}: column {shown(column)} is neither a knob nor a summary "
                f"column{hint}; allowed: a knob, a monitor series' <name>_mean, or "
                f"{', '.join(columns)}"
            )


def build_cells(
    config: dict, images_dir: str | None = None, check: bool = True, args_folder: str | None = None
) -> list[PlannedCell]:
    """Every cell of every experiment of a schema-validated config, checked by the harness (unless
    check is false), then the ceiling cells of the experiments with `ceilings: true` and a target's
    measured compute cells (also checked). `args_folder`: the config file's folder, which `./` and
    `../` paths in a factory's arguments are relative to (with_args_folder)."""
    cells: list[PlannedCell] = []
    defaults = config.get("defaults") or {}
    experiments = config.get("experiments") or {}
    for name in experiments:
        check_name(name)
    check_size(experiments, config.get("max_cells", MAX_CELLS))
    python_path = [os.path.abspath(p) for p in config.get("python_path") or []]

    for name, experiment in experiments.items():
        check_search(name, experiment, defaults)
        expanded = expand_experiment(name, experiment, defaults, images_dir)
        expanded = [
            with_args_folder(with_python_path(cell, python_path), args_folder) for cell in expanded
        ]
        check_plots(name, experiment, expanded)
        if check:
            expanded = [check_cell(cell, images_dir) for cell in expanded]
        cells.extend(expanded)

    derived = ceiling_cells(config, cells)
    derived += list({c.id: c for c in measured_cells(config, cells).values()}.values())
    if check:
        derived = [check_cell(cell, images_dir) for cell in derived]
    if config.get("target"):
        check_cells(read_target(config["target"]), cells)
    return cells + derived


def search_groups(cells: list[PlannedCell], experiment: str, axis: str) -> list[dict]:
    """The cells of a searched experiment by combination of its other knobs: [{"knobs": the other
    knobs that vary in the experiment, "cells": {level of axis: cell}}], in the experiment's
    order."""
    own = [c for c in cells if c.experiment == experiment]
    varying = [
        k
        for k in dict.fromkeys(k for c in own for k in c.knobs)
        if len({same_key(c.knobs.get(k)) for c in own}) > 1
    ]
    groups: dict[str, dict] = {}
    for cell in own:
        rest = {k: v for k, v in cell.knobs.items() if k != axis}
        group = groups.setdefault(
            same_key(rest), {"knobs": {k: rest.get(k) for k in varying if k != axis}, "cells": {}}
        )
        group["cells"][cell.knobs.get(axis, default_of(axis))] = cell
    return list(groups.values())


def search_ceilings(cells: list[PlannedCell], experiment: str, axis: str) -> list[tuple[str, str]]:
    """(experiment, id) of every ceiling cell that bounds a cell of the searched experiment: what
    its checkpoint reads."""

    bounds, sources = Bounds(cells), set()
    for group in search_groups(cells, experiment, axis):
        for cell in group["cells"].values():
            sources |= {(c.experiment, c.id) for c in bounds.of(cell).values() if c is not None}
    return sorted(sources)


def search_levels(cells: list[PlannedCell], experiment: str, axis: str, results_of) -> list[dict]:
    """The checkpoint's groups: per combination of the other knobs, each level's cell id, knobs, the
    cells of its ceilings as the planner's map names them (`links`: `<experiment>/<cell>` or None,
    as in ceiling_map) and their result files (results_of(experiment, cell id) -> paths)."""

    bounds, groups = Bounds(cells), []
    for group in search_groups(cells, experiment, axis):
        levels = []
        for level, cell in group["cells"].items():
            sources = bounds.of(cell)
            ceilings = {s: results_of(c.experiment, c.id) if c else [] for s, c in sources.items()}
            links = {s: f"{c.experiment}/{c.id}" if c else None for s, c in sources.items()}
            levels.append(
                {
                    "level": level,
                    "cell": cell.id,
                    "knobs": cell.knobs,
                    "ceilings": ceilings,
                    "links": links,
                }
            )
        groups.append({"knobs": group["knobs"], "levels": levels})
    return groups


def search_dry_run_line(cells: list[PlannedCell], experiment: str, axis: str) -> str:
    """The line a dry run prints for a searched experiment's checkpoint, before the ceilings
    exist."""

    groups = search_groups(cells, experiment, axis)
    levels = {level for group in groups for level in group["cells"]}
    return dry_run_line(experiment, axis, sorted(levels), len(groups))


def baseline(cells: list[PlannedCell], experiment: str) -> PlannedCell:
    """The experiment's baseline cell: the first level of every axis."""
    return next(c for c in cells if c.experiment == experiment and c.baseline)


def needs_images(cells: list[PlannedCell], images_dir: str) -> bool:
    return any(c.knobs.get("data_dir") == images_dir for c in cells)


def planned_cells(
    config: dict, schema_path: str, configfiles: list, images_dir: str
) -> list[PlannedCell]:
    """The workflow's config, in place: its size bounded, `small` merged (sized), defaults filled
    from the schema, python_path, a target's cpu_speed file and `./` paths in a factory's arguments
    made absolute (relative to the file that sets them); then every cell, checked (build_cells)."""
    count_values(config)
    validate_config(sized(config), schema_path)
    folder = config_dir("python_path", configfiles)
    config["python_path"] = [
        os.path.normpath(os.path.join(folder, p)) for p in config["python_path"]
    ]
    with_speed_file(config.get("target"), config_dir("target", configfiles))
    return build_cells(config, images_dir, args_folder=config_dir("experiments", configfiles))


# What `python -m feedbench run` and `make-images` execute: __main__ and everything it imports.
HARNESS_ENTRY = "__main__"


def _module_file(package_dir: str, dotted: str) -> str | None:
    """The file of a package-relative dotted name (`harness.runner`), a module or a subpackage's
    __init__."""
    path = os.path.join(package_dir, *dotted.split(".")) if dotted else package_dir
    for candidate in (path + ".py", os.path.join(path, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def harness_files(package_dir: str) -> list[str]:
    """The package's modules reachable from __main__ by relative imports (read with ast, lazy
    imports inside functions included), the __init__ of each package on the way, and the package's
    data files (not its README.md files, nor the report's templates)."""
    found: set[str] = set()
    todo = [HARNESS_ENTRY, ""]
    while todo:
        name = todo.pop()
        path = _module_file(package_dir, name)
        if path is None or path in found:
            continue
        found.add(path)
        here = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
        # the packages the module sits in
        todo += [".".join(here[:i]) for i in range(1, len(here) + 1)]
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = here[: len(here) - node.level + 1] + (
                    node.module.split(".") if node.module else []
                )
                todo += [".".join(base)] + [".".join([*base, alias.name]) for alias in node.names]
    files = sorted(found)
    for folder, subfolders, names in os.walk(package_dir):
        # the report's: editing them reruns no cell
        subfolders[:] = [d for d in subfolders if d != "templates"]
        # The layers' README.md files are documentation: editing them reruns no cell either.
        files += [os.path.join(folder, n) for n in names if not n.endswith((".py", ".pyc", ".md"))]
    return sorted(set(files))


def harness_fingerprint(package_dir: str) -> str:
    """sha256 over the harness files (names and contents): the bench rule's `params.harness`."""
    digest = hashlib.sha256()
    for path in harness_files(package_dir):
        digest.update(os.path.relpath(path, package_dir).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read() + b"\0")
    return digest.hexdigest()[:16]
