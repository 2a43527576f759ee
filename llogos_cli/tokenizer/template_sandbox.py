"""A Jinja sandbox that bounds what a template may build and how long it may run.

Jinja's sandbox keeps a template away from Python internals, not from the machine: `'a' * 10**10`
asks for ten gigabytes and two nested loops over range(100000) run for hours. Here the operations
that can build something far larger than their inputs (repetition, powers, formatting, padding,
joins, replacements) are sized before they run, whatever a template concatenates is sized before
it is joined, the rendered text is streamed and cut at a cap, and every loop iteration, call,
operator, filter and output checks a clock (and every sixteenth the process's resident memory).
"""

import functools
import inspect
import re
import resource
import string
import sys
import time
from collections import abc
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import jinja2
from jinja2 import nodes
from jinja2.filters import make_attrgetter
from jinja2.runtime import BlockReference
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.utils import Namespace, generate_lorem_ipsum, pass_context
from jinja2.visitor import NodeTransformer

MAX_LENGTH = 1 << 20      # characters in one string or in the rendered text, items in one list
MAX_INT_BITS = 1 << 16
MAX_SOURCE = 1 << 18      # characters of template source; the largest real chat templates are ~20 KB
TIME_LIMIT_S = 2.0
MEMORY_LIMIT = 128 << 20  # bytes by which a render may raise the process's resident memory


class LimitExceeded(SecurityError):
    """A template tried to build too much or ran too long."""


def render(template: jinja2.Template, /, **variables) -> str:
    """The template's text, rendered under the time, memory and length limits."""
    with _budget():
        pieces, length = [], 0
        for piece in template.generate(**variables):
            length += len(piece)
            _limit(length)
            pieces.append(piece)
        return "".join(pieces)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, filters: dict, functions: dict, **options):
        super().__init__(finalize=_finalize, **options)
        self.filters.update(filters)
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}
        self.filters.update({_ITERATE: _iterate_filter, _CONCAT: _concat_filter})
        self.globals.update(functions, lipsum=_lipsum)

    def from_source(self, source: str) -> jinja2.Template:
        # Compiling runs constant folding, which calls filters: it counts against the same limits.
        with _budget():
            _limit(len(source), "characters of template source", MAX_SOURCE)
            tree = _Instrument().visit(self.parse(source))
            tree.set_environment(self)
            return self.from_string(tree)

    def unsafe_undefined(self, obj, attribute):
        # Jinja's sandbox answers a forbidden attribute with an undefined value that prints as
        # nothing; a template that reaches for Python internals should fail loudly instead.
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} is not allowed")

    def call_binop(self, context, operator, left, right):
        _tick()
        if operator == "*":
            _limit_product(left, right)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            _limit(left.bit_length() * right, "bits in an integer", MAX_INT_BITS)
        elif operator == "%" and isinstance(left, (str, bytes)):
            _limit(_percent_size(left, right))
        return _limit_result(self.binop_table[operator](left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 -- Jinja's own signature
        _tick()
        if isinstance(__obj, BlockReference):
            raise SecurityError("a chat template cannot call its blocks")
        owner, name = getattr(__obj, "__self__", None), getattr(__obj, "__name__", None)
        if isinstance(owner, (str, bytes, int)) and name in _METHOD_SIZE:
            if name == "join" and args:  # sized before joining, so a generator is read once here
                args = (list(args[0]), *args[1:])
            own = {k: v for k, v in kwargs.items() if k not in _JINJA_KEYWORDS}
            _limit(_METHOD_SIZE[name](owner, *args, **own))
        return _limit_result(super().call(__context, __obj, *args, **kwargs))

    def concat(self, pieces):
        # Joins the output buffers of macros, {% set %} blocks and {% filter %} blocks.
        pieces = list(pieces)
        _tick()
        _limit(sum(map(len, pieces)))
        return "".join(pieces)

    def wrap_str_format(self, value):
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__

        @functools.wraps(wrapped)
        def bounded(*args, **kwargs):
            _tick()
            values = [*args, *kwargs.values()]
            if value.__name__ == "format_map" and args and isinstance(args[0], abc.Mapping):
                values = list(args[0].values())
            fields = [(name, spec) for _, name, spec, _ in string.Formatter().parse(fmt) if name is not None]
            widths = [int(n) for _, spec in fields for n in re.findall(r"\d+", spec)]
            _limit(_formatted_size(fmt, len(fields), widths, any("{" in s for _, s in fields), values))
            return wrapped(*args, **kwargs)
        return bounded


# --- the budget of one render ---------------------------------------------------------------------

@dataclass(slots=True)
class _Budget:
    deadline: float
    rss_limit: int
    ticks: int = 0


_BUDGET: ContextVar[_Budget | None] = ContextVar("llogos_template_budget", default=None)


@contextmanager
def _budget():
    token = _BUDGET.set(_Budget(time.monotonic() + TIME_LIMIT_S, _rss() + MEMORY_LIMIT))
    try:
        yield
    finally:
        _BUDGET.reset(token)


def _rss() -> int:
    """Resident bytes now on Linux; elsewhere the peak so far (a looser bound after a larger render)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB on Linux


_PAGE = resource.getpagesize()


def _tick() -> None:
    budget = _BUDGET.get()
    if budget is None:
        return
    if time.monotonic() > budget.deadline:
        raise LimitExceeded(f"it ran longer than {TIME_LIMIT_S:g} s")
    budget.ticks += 1
    # One step allocates at most MAX_LENGTH-sized values, so checking memory every few steps is enough.
    if budget.ticks % 16 == 0 and _rss() > budget.rss_limit:
        raise LimitExceeded(f"it used more than {MEMORY_LIMIT >> 20} MB of memory")


def _limit(size: int, what: str = "characters or items", most: int = MAX_LENGTH) -> None:
    if size > most:
        raise LimitExceeded(f"it would build {size:,} {what} (at most {most:,})")


def _limit_result(value):
    if isinstance(value, (str, bytes, list, tuple)):
        _limit(len(value))
    elif isinstance(value, int):
        _limit(value.bit_length(), "bits in an integer", MAX_INT_BITS)
    return value


def _limit_product(left, right) -> None:
    for seq, count in ((left, right), (right, left)):
        if isinstance(seq, (str, bytes, list, tuple)) and isinstance(count, int):
            _limit(len(seq) * count)
    if isinstance(left, int) and isinstance(right, int):
        _limit(left.bit_length() + right.bit_length(), "bits in an integer", MAX_INT_BITS)


def text_size(value, indent: int = 0) -> int:
    """An upper bound on len(str(value)), or on its JSON or pprint form with `indent` characters per
    level; it stops counting past MAX_LENGTH, so aliased or cyclic values cost no more than that."""
    if isinstance(value, (str, bytes)):
        return len(value)
    total, stack = 0, [(value, 0)]
    while stack and total <= MAX_LENGTH:
        item, depth = stack.pop()
        total += 2 + depth * indent  # separator or quotes, and the indentation of its line
        if isinstance(item, (str, bytes)):
            total += len(item)
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 1
        elif isinstance(item, abc.Mapping):
            stack.extend((x, depth + 1) for pair in item.items() for x in pair)
        elif isinstance(item, Namespace):
            stack.append((item._Namespace__attrs, depth))
        elif isinstance(item, (list, tuple, set, frozenset, abc.MappingView)):
            stack.extend((x, depth + 1) for x in item)
        else:
            total += 64  # floats, None, macros, ranges, loop objects: short fixed reprs
    return total


def _int(value) -> int:
    return value if isinstance(value, int) else 0


# --- formatting -----------------------------------------------------------------------------------

_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


def _percent_size(fmt, args) -> int:
    specs = _PERCENT_SPEC.findall(fmt if isinstance(fmt, str) else fmt.decode("latin-1"))
    values = list(args.values()) if isinstance(args, abc.Mapping) else list(args) if isinstance(args, tuple) else [args]
    widths = [int(n) for spec in specs for n in spec if n.isdigit()]
    return _formatted_size(fmt, len(specs), widths, any("*" in spec for spec in specs), values)


def _formatted_size(fmt, fields: int, widths: list[int], widths_from_args: bool, values: list) -> int:
    """Every field as long as the longest value or the widest width, which may be an argument."""
    if widths_from_args:
        widths += [v for v in values if isinstance(v, int)]
    return len(fmt) + fields * max([*widths, *map(text_size, values)], default=0)


# --- methods, filters and functions that can build more than they are given -----------------------

# Inside a loop or a block, Jinja's compiled calls carry the loop's or block's variables as these
# keywords, which Context.call takes off before calling: they are never the method's own arguments.
_JINJA_KEYWORDS = frozenset({"_loop_vars", "_block_vars"})


def _replace_size(s, old, new, count=-1, *_) -> int:
    hits = s.count(old) if len(old) else len(s) + 1
    return len(s) + (hits if count < 0 else min(hits, count)) * len(new)


def _translate_size(s, table) -> int:
    longest = max((len(v) for v in table.values() if isinstance(v, str)), default=1) if isinstance(table, abc.Mapping) else 1
    return len(s) * longest


_METHOD_SIZE = {  # method name -> size of what the call on a str, bytes or int would build
    "center": lambda s, width=0, *_: width, "ljust": lambda s, width=0, *_: width,
    "rjust": lambda s, width=0, *_: width, "zfill": lambda s, width=0: width,
    "expandtabs": lambda s, tabsize=8: len(s) + s.count(b"\t" if isinstance(s, bytes) else "\t") * tabsize,
    "join": lambda s, items: sum(len(x) for x in items if isinstance(x, (str, bytes))) + len(s) * len(items),
    "replace": _replace_size, "translate": _translate_size,
    "to_bytes": lambda n, length=1, *_, **__: length,
}


def _stringified(a, key) -> None:
    _limit(text_size(a[key]))


def _check_center(a, key) -> None:
    _limit(max(_int(a["width"]), text_size(a[key])))


def _check_indent(a, key) -> None:
    text, width = a[key], a["width"]
    lines = text.count("\n") + 1 if isinstance(text, str) else text_size(text)
    _limit(text_size(text) + lines * (len(width) if isinstance(width, str) else _int(width)))


def _check_wordwrap(a, key) -> None:
    _limit(text_size(a[key]) * (1 + text_size(a["wrapstring"] or "\n")))


def _check_replace(a, key) -> None:
    _stringified(a, key)
    _limit(text_size(a["old"]) + text_size(a["new"]))
    count = a["count"] if isinstance(a["count"], int) else -1
    _limit(_replace_size(str(a[key]), str(a["old"]), str(a["new"]), count))


def _check_format(a, key) -> None:
    _stringified(a, key)
    _limit(_percent_size(str(a[key]), a["kwargs"] or a["args"]))


def _attribute_values(a, key, env) -> list:
    # Sizing reads the iterable, so it is handed on to the filter as a list, attributes already taken.
    items = list(a[key])
    if a["attribute"] is not None:
        items, a["attribute"] = list(map(make_attrgetter(env, a["attribute"]), items)), None
    a[key] = items
    return items


def _check_join(a, key) -> None:
    items = _attribute_values(a, key, a["eval_ctx"].environment)
    _limit(sum(map(text_size, items)) + text_size(a["d"]) * len(items))


def _check_sum(a, key) -> None:
    items = _attribute_values(a, key, a["environment"])
    if isinstance(a["start"], (str, bytes, list, tuple)):
        _limit(len(a["start"]) + sum(len(x) for x in items if isinstance(x, (str, bytes, list, tuple))))


def _check_json(a, key) -> None:
    indent = a.get("indent")
    per_level = len(indent) if isinstance(indent, str) else _int(indent)
    _limit(text_size(a[key], per_level + sum(map(text_size, a.get("separators") or ()))))


_FILTER_CHECKS = {
    **dict.fromkeys(["capitalize", "e", "escape", "forceescape", "lower", "safe", "string", "striptags",
                     "title", "trim", "truncate", "upper", "urlencode", "wordcount", "xmlattr"], _stringified),
    "center": _check_center, "indent": _check_indent, "wordwrap": _check_wordwrap,
    "replace": _check_replace, "format": _check_format, "join": _check_join, "sum": _check_sum,
    "tojson": _check_json, "pprint": lambda a, key: _limit(text_size(a[key], 1)),
    "urlize": lambda a, key: _limit(text_size(a[key]) * (64 + text_size(a["target"]) + text_size(a["rel"]))),
    "batch": lambda a, key: _limit(_int(a["linecount"]) if a["fill_with"] is not None else 0),
    "slice": lambda a, key: _limit(_int(a["slices"])),
    "round": lambda a, key: _limit(abs(_int(a["precision"])) * 4, "bits in an integer", MAX_INT_BITS),
}


def _bounded_filter(name: str, f):
    if getattr(f, "jinja_async_variant", False):  # the environment is not async: take the plain function
        f = f.__wrapped__
    check = _FILTER_CHECKS.get(name)
    signature = inspect.signature(f)
    key = list(signature.parameters)[1 if hasattr(f, "jinja_pass_arg") else 0]

    @functools.wraps(f)
    def run(*args, **kwargs):
        _tick()
        if check is not None:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            check(bound.arguments, key)
            args, kwargs = bound.args, bound.kwargs
        result = f(*args, **kwargs)
        # Lazy filters (map, select, unique, batch...) feed each other item by item: each item ticks.
        return _iterate(result) if isinstance(result, abc.Iterator) else _limit_result(result)
    return run


def _lipsum(n=5, html=True, min=20, max=100):
    _limit(_int(n) * _int(max) * 16)  # words of up to 16 characters with their markup
    return generate_lorem_ipsum(n, html, min, max)


def _finalize(value):
    _tick()
    if not isinstance(value, str):
        _limit(text_size(value))
    return value


# --- loops and `~`, rewritten to pass through these two filters -----------------------------------

_ITERATE, _CONCAT = "llogos_bounded_iterate", "llogos_bounded_concat"


def _iterate(iterable):
    for item in iterable:
        _tick()
        yield item


# pass_context keeps the compiler from evaluating these while it folds constants.
@pass_context
def _iterate_filter(context, iterable):
    return _iterate(iterable)


@pass_context
def _concat_filter(context, pieces):
    _tick()
    _limit(sum(map(text_size, pieces)))
    return "".join(map(str, pieces))


class _Instrument(NodeTransformer):
    """Every {% for %} iterates through _ITERATE and every `a ~ b` goes through _CONCAT: a loop is a
    Python for over whatever iterable it is given, and only an iterator of our own can stop it."""

    def visit_For(self, node):
        node = self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, _ITERATE, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node):
        node = self.generic_visit(node)
        return nodes.Filter(nodes.List(node.nodes, lineno=node.lineno), _CONCAT, [], [], None, None,
                            lineno=node.lineno)
