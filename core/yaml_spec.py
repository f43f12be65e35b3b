"""YAML files validated into pydantic models, with problems that name the line and field.

Shared by the remediation policy (core/policy.py) and the cluster spec (core/cluster_spec.py):
a file is read with a size bound, its entries counted in a cheap streaming pass (refused past
a bound before anything builds a tree), parsed with PyYAML's safe loader, refused when
aliases expand it past that bound or a key is given twice, and validated; each pydantic error
is mapped back onto the YAML node it is about, so `file:line: field: message` points at the
mistake.
"""

from __future__ import annotations

import difflib
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

# A loc part that names a branch of a tagged union, not a key of the file: `<...>` (the
# cluster spec's `policy:` is a file name or an inline policy).
TAG_OPEN = "<"


@dataclass(frozen=True)
class SpecProblem:
    """One thing wrong with a file: where (1-based line, dotted field) and what.

    `source` names another file the problem is in (a policy file a cluster spec names)."""

    line: int | None
    field: str
    message: str
    source: str | None = None


class SpecError(ValueError):
    """A file that cannot be used; the message lists every problem, one per line."""

    def __init__(self, path: Path | str, problems: list[SpecProblem]) -> None:
        self.path = str(path)
        self.problems = problems
        super().__init__("\n".join(format_problem(self.path, p) for p in problems))


def format_problem(path: str, p: SpecProblem) -> str:
    source = p.source or path
    where = f"{source}:{p.line}" if p.line is not None else source
    return f"{where}: {p.field}: {p.message}" if p.field else f"{where}: {p.message}"


@dataclass(frozen=True)
class SpecFormat(Generic[M]):
    """What a kind of file is validated as, its bounds, and how its errors read."""

    model: type[M]
    error: type[SpecError]
    what: str  # "a policy", "a cluster spec": in messages
    max_bytes: int
    # Entries (keys, values, list items) of the document, and the bound on their number
    # once aliases are expanded.
    max_nodes: int
    root_message: str  # when the document is not a mapping


def load_yaml_model(path: Path | str, fmt: SpecFormat[M]) -> M:
    """Read and validate a file; `fmt.error` names the line and field of each problem."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > fmt.max_bytes:
            raise fmt.error(path, [_too_large(size, fmt)])
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise fmt.error(path, [SpecProblem(None, "", f"cannot read: {e}")]) from None
    return parse_yaml_model(text, str(path), fmt)


def parse_yaml_model(text: str, source: str, fmt: SpecFormat[M]) -> M:
    """Validate YAML held in memory; `source` names it in errors."""
    root, data = parse_yaml(text, source, fmt)
    return validate_node(root, data, source, fmt)


def parse_yaml(text: str, source: str, fmt: SpecFormat[Any]) -> tuple[yaml.Node, Any]:
    """The document's node tree (for line numbers) and its constructed data."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > fmt.max_bytes:
        raise fmt.error(source, [_too_large(size, fmt)])
    # Building the node tree costs seconds per megabyte: count the entries first, in a pass
    # that builds nothing and stops as soon as there are too many.
    if count_entries(text, fmt.max_nodes) > fmt.max_nodes:
        raise fmt.error(
            source,
            [
                SpecProblem(
                    None,
                    "",
                    f"the document has more than {fmt.max_nodes} entries (keys, values and "
                    f"list items); {fmt.what} may have at most {fmt.max_nodes}",
                )
            ],
        )
    try:
        loader = yaml.SafeLoader(text)  # refuses a character YAML does not allow
    except yaml.YAMLError as e:
        raise fmt.error(source, [SpecProblem(None, "", f"YAML error: {e}")]) from None
    try:
        root = loader.get_single_node()
        if root is None:
            raise fmt.error(source, [SpecProblem(1, "", "the file is empty")])
        # Aliases share nodes: a few hundred bytes can name billions of them. Count the
        # expanded size first, in time linear in the file, before anything walks the tree.
        if expanded_size(root, fmt.max_nodes) > fmt.max_nodes:
            raise fmt.error(
                source,
                [
                    SpecProblem(
                        None,
                        "",
                        f"the document expands to more than {fmt.max_nodes} values "
                        "(YAML aliases repeated too often)",
                    )
                ],
            )
        # Checked on the pristine tree: constructing it flattens `<<` merges in place.
        dups = duplicate_keys(root, ())
        if dups:
            raise fmt.error(source, dups)
        data = loader.construct_document(root)
    except yaml.MarkedYAMLError as e:
        raise fmt.error(source, [syntax_problem(e)]) from None
    except yaml.YAMLError as e:
        raise fmt.error(source, [SpecProblem(None, "", f"YAML error: {e}")]) from None
    except RecursionError:
        raise fmt.error(source, [SpecProblem(None, "", "nested too deeply")]) from None
    finally:
        loader.dispose()
    return root, data


def validate_node(root: yaml.Node, data: Any, source: str, fmt: SpecFormat[M]) -> M:
    try:
        return fmt.model.model_validate(data)
    except ValidationError as e:
        raise fmt.error(source, [problem_at(root, err, fmt) for err in e.errors()]) from None


# libyaml's parser when PyYAML was built with it (its wheels are): ~20x faster than the
# pure-Python one, which is the fallback.
_FastLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_ENTRY_EVENTS = (yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent, yaml.AliasEvent)


def count_entries(text: str, limit: int) -> int:
    """Entries the document writes out (each key, value and list item; an alias counts
    once), counted from the parser's event stream without building anything, stopping past
    `limit`. A lower bound of what aliases expand it to, so a count past the bound refuses
    nothing the expanded-size check would let through. A document the fast parser cannot
    read is left to the full parse, which names the line of the mistake."""
    count = 0
    try:
        loader = _FastLoader(text)  # a character YAML refuses can stop it here already
    except (yaml.YAMLError, ValueError):
        return count
    try:
        while (event := loader.get_event()) is not None:
            if isinstance(event, _ENTRY_EVENTS):
                count += 1
                if count > limit:
                    break
    except (yaml.YAMLError, ValueError):
        pass
    finally:
        loader.dispose()
    return count


def _too_large(size: int, fmt: SpecFormat[Any]) -> SpecProblem:
    return SpecProblem(
        None, "", f"the file is {size} bytes; {fmt.what} may be at most {fmt.max_bytes} bytes"
    )


def expanded_size(root: yaml.Node, limit: int) -> int:
    """Values the document holds once every alias is expanded, stopping past `limit`.

    Each distinct node's size is computed once (aliases point at the same node object), so
    this is linear in the file however deeply aliases nest; a cycle counts as too many.
    """
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    cap = limit + 1

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in visiting:
            return cap
        visiting.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                total += size(k) + size(v)
                if total >= cap:
                    break
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item)
                if total >= cap:
                    break
        visiting.discard(key)
        sizes[key] = min(total, cap)
        return sizes[key]

    return size(root)


def syntax_problem(e: yaml.MarkedYAMLError) -> SpecProblem:
    mark = e.problem_mark or e.context_mark
    what = e.problem or e.context or "invalid YAML"
    if e.context and e.problem:
        # e.g. "expected ',' or '}', but got ':' (while parsing a flow mapping, line 3)"
        started = e.context_mark
        if started is not None and mark is not None and started.line != mark.line:
            what += f" ({e.context}, line {started.line + 1})"
        else:
            what += f" ({e.context})"
    return SpecProblem(mark.line + 1 if mark else None, "", f"YAML syntax error: {what}")


def duplicate_keys(node: yaml.Node, path: tuple[str, ...]) -> list[SpecProblem]:
    """PyYAML keeps the last of two equal keys without a word; our files must not."""
    problems: list[SpecProblem] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            if key.tag == "tag:yaml.org,2002:merge" or not isinstance(key, yaml.ScalarNode):
                continue
            line = key.start_mark.line + 1
            if key.value in seen:
                problems.append(
                    SpecProblem(
                        line,
                        dotted((*path, key.value)),
                        f"duplicate key (first given on line {seen[key.value]})",
                    )
                )
            else:
                seen[key.value] = line
            problems += duplicate_keys(value, (*path, key.value))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            problems += duplicate_keys(item, (*path, f"[{i}]"))
    return problems


def dotted(parts: tuple[str, ...]) -> str:
    out = ""
    for p in parts:
        out += p if p.startswith("[") or not out else f".{p}"
    return out


def node_at(root: yaml.Node, loc: tuple[int | str, ...]) -> tuple[int, str]:
    """The line and dotted field of the value at `loc` (the nearest enclosing node's line
    when part of it is missing)."""
    node: yaml.Node | None = root
    line = root.start_mark.line + 1
    parts: list[str] = []
    for i, part in enumerate(loc):
        if part == "[key]":
            break
        if isinstance(part, str) and part.startswith(TAG_OPEN):
            continue  # a union's branch, not a key
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            parts.append(f"[{part}]")
            node = node.value[part] if 0 <= part < len(node.value) else None
            if node is not None:
                line = node.start_mark.line + 1
            continue
        parts.append(str(part))
        pair = _find_key(node, part) if isinstance(node, yaml.MappingNode) else None
        if pair is None:
            node = None  # a missing field: keep the line of the nearest enclosing node
            continue
        key, value = pair
        # A wrong key, or a nested block, is reported where its key is written.
        is_key_error = loc[i + 1 : i + 2] == ("[key]",)
        scalar = isinstance(value, yaml.ScalarNode)
        line = (value if scalar and not is_key_error else key).start_mark.line + 1
        node = value
    return line, dotted(tuple(parts))


def problem_at(root: yaml.Node, err: Any, fmt: SpecFormat[Any]) -> SpecProblem:
    """Map one pydantic error onto the YAML node it is about, by walking `loc` down the tree."""
    loc: tuple[int | str, ...] = tuple(err["loc"])
    line, field = node_at(root, loc)
    message = str(err["msg"])
    if err["type"] == "extra_forbidden":
        message = _unknown_field_message(fmt.model, loc)
    elif err["type"] == "missing":
        message = "required field is missing"
    elif err["type"] == "model_type" and not loc:
        message = fmt.root_message
    return SpecProblem(line, field, message)


def _find_key(node: yaml.MappingNode, part: int | str) -> tuple[yaml.Node, yaml.Node] | None:
    # The last match wins, as it does when the YAML is constructed (and after `<<` merges).
    for key, value in reversed(node.value):
        if isinstance(key, yaml.ScalarNode) and key.value == str(part):
            return key, value
    return None


def _unknown_field_message(root: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    model = model_at(root, loc[:-1])
    if model is None:
        return "unknown field"
    known = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    if close:
        return f"unknown field; did you mean {close[0]!r}?"
    return f"unknown field; expected one of: {', '.join(known)}"


def _model_of(ann: Any) -> Any:
    """`X | None`, `Annotated[X | Y, ...]`: the one model class among the branches, if any."""
    origin = get_origin(ann)
    if origin is Union or origin is types.UnionType:
        models = [
            m
            for m in (_model_of(a) for a in get_args(ann))
            if isinstance(m, type) and issubclass(m, BaseModel)
        ]
        return models[0] if len(models) == 1 else ann
    if hasattr(ann, "__metadata__"):  # Annotated
        return _model_of(get_args(ann)[0])
    return ann


def model_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class that the value at `loc` is validated as."""
    model: type[BaseModel] = root
    parts = [p for p in loc if not (isinstance(p, str) and p.startswith(TAG_OPEN))]
    while parts:
        field = model.model_fields.get(str(parts.pop(0)))
        if field is None:
            return None
        ann = _model_of(field.annotation)
        if get_origin(ann) in (dict, list):
            if not parts:
                return None
            parts.pop(0)
            ann = _model_of(get_args(ann)[-1])
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model
