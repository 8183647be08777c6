"""``convergent data``: list the offline data sources, and fetch them into the cache."""

from __future__ import annotations

import argparse


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``data list`` and ``data fetch`` to ``commands``."""
    parser = commands.add_parser("data", help="list and fetch the offline data sources")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="each source and whether it is cached")
    fetch = actions.add_parser("fetch", help="fetch sources into the cache")
    fetch.add_argument(
        "names", nargs="+", metavar="NAME", help="the sources to fetch ('convergent data list')"
    )
    fetch.add_argument("--force", action="store_true", help="fetch again even if cached")
    parser.set_defaults(handler=run)


def run(arguments: argparse.Namespace) -> int:
    """``convergent data``'s parsed flags: do the action asked for; returns the exit status."""
    actions = {"list": _list_sources, "fetch": _fetch_sources}
    return actions[arguments.action](arguments)


def _list_sources(arguments: argparse.Namespace) -> int:
    """Print each source, whether it is cached, and the cache folder."""
    from convergent.data import GENERATED_SOURCES, cache_root, describe_sources

    rows = describe_sources()
    width = max(len(name) for name in [*(row["name"] for row in rows), *GENERATED_SOURCES])
    for row in rows:
        state = "cached" if row["cached"] else "not cached"
        size = f"{row['size'] / 1e6:8.1f} MB" if row.get("size") else " " * 11
        print(f"{row['name']:<{width}}  {state:<10}  {size}  {row['description']}")
    for name, description in GENERATED_SOURCES.items():
        print(f"{name:<{width}}  {'generated':<10}  {'':11}  {description}")
    print(
        f"{'hf:NAME':<{width}}  {'':<10}  {'':11}  a Hugging Face dataset by name (online) or a local file"
    )
    print(f"cache: {cache_root()}")
    return 0


def _fetch_sources(arguments: argparse.Namespace) -> int:
    """Fetch the sources named into the cache, printing where each went."""
    from convergent.data import GENERATED_SOURCES, fetch

    for name in arguments.names:
        if name in GENERATED_SOURCES:
            print(f"{name}: generated locally when loaded; nothing to fetch")
            continue
        path = fetch(name, force=arguments.force)
        print(f"{name}: {path}")
    return 0
