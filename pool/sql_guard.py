"""The analyst SQL guard: ClickHouse's own parser says what a query is, an allow-list says what may run.

The candidate text never runs before it passes. It reaches the engine only as the bound string
parameter of ``parseQueryToJSON`` (or ``formatQuerySingleLine``), which parse exactly one statement and
refuse multi-statements, so heredocs, comments, escapes and look-alike characters are read the way the
engine reads them, never by a regex. The JSON syntax tree is then walked, failing closed:

- statements: ``SELECT``/``WITH``/``UNION``/``INTERSECT``/``EXCEPT``, ``EXPLAIN`` (AST, SYNTAX, PLAN,
  PIPELINE, ESTIMATE, QUERY TREE) of such a query, ``SHOW TABLES``; ``DESCRIBE``, ``EXISTS`` and
  ``SHOW CREATE`` of one pool table, which the engine cannot express in JSON, are re-built from their
  canonical text and run as a statement of ours;
- node types and node keys from fixed allow-lists (no ``SETTINGS``, ``FORMAT``, ``INTO OUTFILE``,
  ``SHOW DATABASES``/``SETTINGS``/``PROCESSLIST``...: whatever the lists do not name is refused);
- functions whose ``system.functions`` category is a pure-computation one, plus a short list of harmless
  ones from the catch-all categories; never files, network, dictionaries, introspection, AI, sleep,
  server or session state. Aliases and aggregate combinators resolve to the function they name;
- table functions: ``numbers``, ``zeros``, ``generateSeries``, ``values`` only;
- tables: unqualified (the pool database, the session's current one) or qualified by the pool database;
  no ``system`` or other database, no table named by a query parameter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any


class GuardRefusal(ValueError):
    """The statement parses but is not allowed; the message names the construct."""


ROOT_TYPES = frozenset({"SelectWithUnionQuery", "SelectIntersectExceptQuery", "ExplainQuery",
                        "ShowTablesQuery"})
STREAMING_ROOTS = frozenset({"SelectWithUnionQuery", "SelectIntersectExceptQuery"})
NODE_TYPES = ROOT_TYPES | frozenset({
    "ArrayJoin", "Asterisk", "ColumnsApplyTransformer", "ColumnsExceptTransformer", "ColumnsListMatcher",
    "ColumnsRegexpMatcher", "ColumnsReplaceTransformer", "ColumnsReplaceTransformerReplacement",
    "ColumnsTransformerList", "ExpressionList", "Function", "Identifier", "InterpolateElement", "Literal",
    "OrderByElement", "QualifiedAsterisk", "QualifiedColumnsListMatcher", "QualifiedColumnsRegexpMatcher",
    "QueryParameter", "SampleRatio", "SelectQuery", "Subquery", "TableExpression", "TableIdentifier",
    "TableJoin", "TablesInSelectQuery", "TablesInSelectQueryElement", "WindowDefinition", "WindowListElement",
    "WithElement",
})
NODE_KEYS = frozenset({
    "alias", "arguments", "array_join", "case_insensitive_like", "children", "collation", "column",
    "database_and_table_name", "definition", "denominator", "direction", "distinct", "expr", "expression",
    "expression_list", "fill_from", "fill_step", "fill_to", "final", "frame_begin_offset",
    "frame_begin_preceding", "frame_begin_type", "frame_end_offset", "frame_end_preceding", "frame_end_type",
    "frame_is_default", "frame_type", "from", "func_name", "group_by", "group_by_all", "group_by_with_cube",
    "group_by_with_grouping_sets", "group_by_with_rollup", "group_by_with_totals", "having", "interpolate",
    "is_compound_name", "is_lambda_function", "is_operator", "is_outfile_append", "is_outfile_truncate",
    "is_window_function", "kind", "like", "limit_by", "limit_by_length", "limit_by_offset", "limit_length",
    "limit_offset", "limit_with_ties", "list_of_modes", "list_of_selects", "locality", "name", "name_parts",
    "not_like", "nulls_direction", "nulls_direction_was_explicitly_specified", "numerator", "on_expression",
    "order_by", "order_by_all", "param_type", "parameters", "partition_by", "pattern", "prewhere",
    "qualifier", "qualify", "query", "recursive_with", "sample_offset", "sample_size", "select", "strictness",
    "subquery", "table_expression", "table_function", "table_join", "tables", "transformers", "type",
    "union_mode", "using_expression_list", "value", "where", "window", "window_definition", "window_name",
    "with", "with_fill",
})
"""Keys a node may carry (besides EXPLAIN's ``settings``: its options, checked on their own)."""

REFUSED_KEYS: Mapping[str, str] = {
    "settings": "SETTINGS, SET and SHOW SETTINGS are refused: limits are set by the server",
    "out_file": "INTO OUTFILE writes files and is refused",
    "is_into_outfile_with_stdout": "INTO OUTFILE writes files and is refused",
    "format_ast": "drop the FORMAT clause and ask for the format in the request instead",
    "compression": "INTO OUTFILE writes files and is refused",
}
EXPLAIN_KINDS = frozenset({"EXPLAIN", "EXPLAIN AST", "EXPLAIN SYNTAX", "EXPLAIN PIPELINE", "EXPLAIN ESTIMATE",
                           "EXPLAIN QUERY TREE"})
EXPLAIN_OPTIONS = frozenset({"actions", "compact", "description", "graph", "header", "indexes", "json",
                             "keep_logical_steps", "optimize", "oneline", "projections", "run_passes",
                             "sorting", "distributed"})
TABLE_FUNCTIONS = frozenset({"numbers", "zeros", "generateseries", "generate_series", "values"})
"""Lower-cased: table functions that only generate rows; every other one (files, URLs, object stores,
other servers, processes, ``merge``/``view``/``cluster``, the engine's own ``python``/``eval``) is refused."""

IN_FUNCTIONS = frozenset({"in", "notIn", "globalIn", "globalNotIn", "nullIn", "notNullIn", "globalNullIn",
                          "globalNotNullIn"})
"""``x IN name``: the right side may name a table, so it is checked like one."""

ALLOWED_CATEGORIES = frozenset({
    "Aggregate Functions", "Arithmetic", "Arrays", "Bit", "Bitmap", "Comparison", "Conditional",
    "Dates and Times", "Distance", "Encoding", "Encryption", "Financial", "Geo", "Geo Polygon", "Hash",
    "IP Address", "JSON", "Logical", "Map", "Mathematical", "Null", "NumericIndexedVector", "QBit",
    "Random Number", "Rounding", "String", "String Replacement", "String Search", "String Splitting",
    "Time Series", "Time Window", "Tuple", "Type Conversion", "URL", "UUID",
})
"""``system.functions`` categories of pure computation. Refused: ``Other`` (except the names below),
``Dictionary``, ``Embedded Dictionary``, ``Introspection``, ``Machine Learning``, ``AI``, ``Internal``,
uncategorized names that alias none of the allowed, and any category a later engine adds."""

ALLOWED_EXTRA = frozenset({
    "bar", "blockSize", "byteSize", "caseWithExpression", "countDigits", "currentDatabase",
    "defaultValueOfArgumentType", "defaultValueOfTypeName", "finalizeAggregation",
    "formatReadableDecimalSize", "formatReadableQuantity", "formatReadableSize", "formatReadableTimeDelta",
    "getSizeOfEnumType",
    "getSubcolumn", "identity", "ignore", "indexHint", "initializeAggregation", "isConstant",
    "isDecimalOverflow", "materialize", "neighbor", "parseISO8601Duration", "parseReadableSize",
    "parseReadableSizeOrNull", "parseReadableSizeOrZero", "parseTimeDelta", "rowNumberInAllBlocks",
    "rowNumberInBlock", "runningAccumulate", "runningDifference", "runningDifferenceStartingWithFirstValue",
    "throwIf", "toColumnTypeName", "toTypeName", "transform", "variantElement", "variantType", "visibleWidth",
})
"""Pure helpers from the ``Other``/``Internal`` categories (``CASE x WHEN`` parses to caseWithExpression)."""

CATALOGUE_QUERY = ("SELECT name, categories, alias_to, case_insensitive, is_aggregate FROM system.functions "
                   "FORMAT JSONEachRow")
COMBINATORS_QUERY = "SELECT name FROM system.aggregate_function_combinators FORMAT JSONEachRow"

_PLAIN = r"[A-Za-z_][A-Za-z0-9_]*"
_SHAPES = (
    (re.compile(rf"DESCRIBE TABLE (?:({_PLAIN})\.)?({_PLAIN})"), "DESCRIBE TABLE {table}"),
    (re.compile(rf"EXISTS (TABLE|VIEW) (?:({_PLAIN})\.)?({_PLAIN})"), "EXISTS {kind} {table}"),
    (re.compile(rf"SHOW CREATE (TABLE|VIEW) (?:({_PLAIN})\.)?({_PLAIN})"), "SHOW CREATE {kind} {table}"),
)


@dataclass(frozen=True)
class Catalogue:
    """The functions the engine knows, reduced to the names the guard allows."""

    allowed: frozenset[str]
    allowed_folded: frozenset[str]
    aggregates: frozenset[str]
    aggregates_folded: frozenset[str]
    combinators: tuple[str, ...]

    @classmethod
    def build(cls, functions: Iterable[Mapping[str, Any]], combinators: Iterable[str]) -> Catalogue:
        rows = {str(row["name"]): row for row in functions}

        def pure(name: str) -> bool:
            return rows[name]["categories"] in ALLOWED_CATEGORIES or name in ALLOWED_EXTRA

        allowed = {name for name, row in rows.items()
                   if (target := str(row["alias_to"]) or name) in rows and pure(target)}
        aggregates = {name for name in allowed if rows[name]["is_aggregate"]}
        return cls(frozenset(allowed),
                   frozenset(name.lower() for name in allowed if rows[name]["case_insensitive"]),
                   frozenset(aggregates),
                   frozenset(name.lower() for name in aggregates if rows[name]["case_insensitive"]),
                   tuple(sorted(combinators, key=len, reverse=True)))

    def allows(self, name: str) -> bool:
        """True for an allowed function or alias, or an allowed aggregate under combinators (``sumIf``...)."""
        return name in self.allowed or name.lower() in self.allowed_folded or self._combined(name)

    def _combined(self, name: str) -> bool:
        return any(name.endswith(suffix) and len(name) > len(suffix) and self._aggregate(name[: -len(suffix)])
                   for suffix in self.combinators)

    def _aggregate(self, name: str) -> bool:
        return name in self.aggregates or name.lower() in self.aggregates_folded or self._combined(name)


@dataclass(frozen=True)
class Checked:
    """A statement that passed: the text to run, the query parameters it uses, and whether the engine
    can stream its result (SELECTs; chDB answers SHOW/DESCRIBE/EXPLAIN in one piece)."""

    text: str
    parameters: frozenset[str]
    streams: bool = False


def check_tree(tree: Mapping[str, Any], text: str, database: str, catalogue: Catalogue) -> Checked:
    """``text`` if its syntax tree (``parseQueryToJSON``'s JSON) is an allowed read, else ``GuardRefusal``."""
    root_type = tree.get("type")
    if root_type not in ROOT_TYPES:
        raise GuardRefusal(f"{_statement_name(tree)} is not a read-only statement; allowed: SELECT, WITH, "
                           "UNION, EXPLAIN, SHOW TABLES, DESCRIBE, EXISTS, SHOW CREATE")
    parameters: set[str] = set()
    for node, parent_key, parent in _nodes(tree):
        _check_node(node, parent_key, parent, database, catalogue, parameters)
    return Checked(text, frozenset(parameters), streams=root_type in STREAMING_ROOTS)


def check_canonical(canonical: str, database: str) -> Checked:
    """A statement the engine cannot express in JSON, by its canonical one-line text: DESCRIBE, EXISTS or
    SHOW CREATE of one pool table, re-built by us; anything else is refused."""
    for pattern, template in _SHAPES:
        match = pattern.fullmatch(canonical)
        if match is None:
            continue
        *kind, qualifier, table = match.groups()
        _check_database(qualifier, database, f"{qualifier}.{table}")
        return Checked(template.format(kind=kind[0] if kind else "", table=f"`{table}`"), frozenset())
    verb = " ".join(canonical.split()[:2]) or "an empty statement"
    raise GuardRefusal(f"{verb} is not allowed; allowed: SELECT, WITH, UNION, EXPLAIN, SHOW TABLES, "
                       "and DESCRIBE TABLE, EXISTS TABLE or SHOW CREATE TABLE of one pool table")


def _statement_name(tree: Mapping[str, Any]) -> str:
    kind = str(tree.get("type", "statement"))
    return kind[:-5] if kind.endswith("Query") else kind


def _nodes(tree: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], str, Mapping[str, Any] | None]]:
    """Every node with the key it hangs under and its parent, iteratively (deep trees need no recursion)."""
    stack: list[tuple[Any, str, Mapping[str, Any] | None]] = [(tree, "", None)]
    while stack:
        value, key, parent = stack.pop()
        if isinstance(value, list):
            stack.extend((item, key, parent) for item in value)
        elif isinstance(value, dict):
            yield value, key, parent
            if value.get("type") == "Literal":
                continue  # a literal's value is data, never code
            for child_key, child in value.items():
                if isinstance(child, dict | list):
                    stack.append((child, child_key, value))


def _check_node(node: Mapping[str, Any], parent_key: str, parent: Mapping[str, Any] | None, database: str,
                catalogue: Catalogue, parameters: set[str]) -> None:
    kind = node.get("type")
    if kind is None:
        return  # the explain options' name/value pairs, checked with their ExplainQuery
    if kind == "SetQuery":
        if parent is not None and parent.get("type") == "ExplainQuery" and parent_key == "settings":
            options = {str(change.get("name")) for change in node.get("changes", [])}
            if not options <= EXPLAIN_OPTIONS:
                raise GuardRefusal(f"EXPLAIN options {sorted(options - EXPLAIN_OPTIONS)} are not allowed")
            return
        raise GuardRefusal("SETTINGS and SET are refused: limits are set by the server")
    if kind not in NODE_TYPES:
        raise GuardRefusal(f"{_statement_name(node)} is not allowed here")
    for key in node:
        if key == "settings" and kind == "ExplainQuery":
            continue
        if key in REFUSED_KEYS:
            if node[key] is not False:
                raise GuardRefusal(REFUSED_KEYS[key])
        elif key not in NODE_KEYS:
            raise GuardRefusal(f"{_statement_name(node)} with {key!r} is not allowed")
    if kind == "ExplainQuery" and node.get("kind") not in EXPLAIN_KINDS:
        raise GuardRefusal(f"{node.get('kind')} is not allowed; allowed: {', '.join(sorted(EXPLAIN_KINDS))}")
    if kind == "ShowTablesQuery" and "from" in node:
        source = node["from"]
        name = str(source.get("name")) if isinstance(source, dict) else "?"
        _check_database(name, database, "SHOW TABLES FROM")
    if kind == "QueryParameter":
        if str(node.get("param_type", "")).strip() == "Identifier":
            raise GuardRefusal("Identifier query parameters are refused: name tables and columns in the text")
        parameters.add(str(node.get("name")))
    if kind == "TableIdentifier":
        _check_table(node, database)
    if kind == "Function":
        _check_function(node, parent_key, catalogue, database)
    if kind == "ColumnsApplyTransformer" and "func_name" in node:
        name = str(node["func_name"])
        if not catalogue.allows(name):
            raise GuardRefusal(f"function {name} is not allowed in the analyst SQL")


def _check_function(node: Mapping[str, Any], parent_key: str, catalogue: Catalogue, database: str) -> None:
    name = str(node.get("name", ""))
    if parent_key == "table_function":
        if name.lower() not in TABLE_FUNCTIONS:
            raise GuardRefusal(f"table function {name} is not allowed; allowed: numbers, zeros, "
                               "generateSeries, values (and the pool's tables)")
        return
    if name == "lambda" and node.get("is_lambda_function"):
        return
    if not catalogue.allows(name):
        raise GuardRefusal(f"function {name} is not allowed in the analyst SQL (it reaches outside the pool, "
                           "or is not a pure function)")
    if name in IN_FUNCTIONS:
        arguments = node.get("arguments", {}).get("children", [])
        right = arguments[1] if len(arguments) == 2 else None
        if isinstance(right, dict) and right.get("type") == "Identifier":
            _check_table(right, database)


def _check_table(node: Mapping[str, Any], database: str) -> None:
    if node.get("children"):
        raise GuardRefusal("table names from query parameters are refused")
    parts = node.get("name_parts") or [node.get("name", "")]
    if len(parts) > 2:
        raise GuardRefusal(f"table {'.'.join(map(str, parts))} is not a pool table")
    if len(parts) == 2:
        _check_database(str(parts[0]), database, ".".join(map(str, parts)))


def _check_database(name: str | None, database: str, what: str) -> None:
    if name is not None and name != database:
        raise GuardRefusal(f"{what}: only the pool database ({database}) may be read")
