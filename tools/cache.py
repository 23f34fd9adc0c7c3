"""torchtpu-cache: inspect and maintain torch_tpu's on-disk compile caches (L2 and L3).

    torchtpu-cache stats  [--dir DIR] [--url URL] [--tier l2|l3|all]   entries and bytes per tier
    torchtpu-cache list   [...]                                        one line per entry
    torchtpu-cache verify [...] [--delete-bad]                         check every entry
    torchtpu-cache clear  [...]                                        remove entries

The L2 directory is --dir, else TORCH_TPU_CACHE_DIR, else the default
(~/.cache/torch_tpu/executables); L3 is --url, else TORCH_TPU_CACHE_URL (none: no L3).
Exit status 0, or 1 on an error or (verify) a bad entry; never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, NoReturn

PROG = "torchtpu-cache"


class _Parser(argparse.ArgumentParser):
    """Usage errors are one-line errors with exit status 1, like every other error."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see --help)")


class UsageError(Exception):
    pass


def _arg_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", default=None, help="L2 cache directory (default: TORCH_TPU_CACHE_DIR or ~/.cache/torch_tpu/executables)")
    common.add_argument("--url", default=None, help="L3 cache URL (default: TORCH_TPU_CACHE_URL)")
    common.add_argument("--tier", choices=("l2", "l3", "all"), default="all", help="which tier to act on (default all)")
    p = _Parser(prog=PROG, description="Inspect and maintain torch_tpu's L2/L3 compile caches.", allow_abbrev=False)
    sub = p.add_subparsers(dest="command", required=True, metavar="{stats,list,verify,clear}")
    sub.add_parser("stats", parents=[common], help="entries and total size per tier")
    sub.add_parser("list", parents=[common], help="one line per entry: tier, key, size, age, platform, name")
    verify = sub.add_parser("verify", parents=[common], help="check every entry; exit 1 if one is bad")
    verify.add_argument("--delete-bad", action="store_true", help="remove the entries that fail")
    sub.add_parser("clear", parents=[common], help="remove every entry (and leftover temporary files and locks)")
    return p


def _tiers(args: argparse.Namespace) -> list[tuple[str, Any]]:
    from torch_tpu.core import config
    from torch_tpu.runtime.cache import default_cache_dir
    from torch_tpu.runtime.cache_store import LocalDirStore, open_store
    from torch_tpu.runtime.errors import CacheError

    tiers: list[tuple[str, Any]] = []
    if args.tier in ("l2", "all"):
        path = args.dir or config.get("TORCH_TPU_CACHE_DIR") or default_cache_dir()
        tiers.append(("L2", LocalDirStore(path, "compile cache directory")))
    if args.tier in ("l3", "all"):
        url = args.url or config.get("TORCH_TPU_CACHE_URL")
        if url:
            try:
                tiers.append(("L3", open_store(url)))
            except CacheError as err:
                raise UsageError(str(err)) from None
        elif args.tier == "l3":
            raise UsageError("no L3 cache: pass --url or set TORCH_TPU_CACHE_URL")
    return tiers


def _check_safe(store: Any) -> None:
    from torch_tpu.runtime.cache_store import LocalDirStore

    if isinstance(store, LocalDirStore) and os.path.isdir(store.path):
        store.ensure()  # raises UnsafeCacheDirError for a directory others can write


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _age(mtime: float) -> str:
    seconds = max(0.0, time.time() - mtime)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def cmd_stats(tiers: list[tuple[str, Any]]) -> int:
    for tier, store in tiers:
        _check_safe(store)
        entries = store.list()
        total = sum(e.size for e in entries)
        line = f"{tier}  {store.location}: {len(entries)} entries, {_human(total)}"
        if entries:
            line += f", newest {_age(max(e.mtime for e in entries))} old, oldest {_age(min(e.mtime for e in entries))} old"
        print(line)
    return 0


def cmd_list(tiers: list[tuple[str, Any]]) -> int:
    from torch_tpu.runtime.cache_store import read_header

    for tier, store in tiers:
        _check_safe(store)
        for entry in store.list():
            try:
                _, meta = read_header(store, entry.name)
                meta = meta or {}
                info = f"{meta.get('platform', '?')}  {meta.get('name', '?')}"
            except Exception as err:  # noqa: BLE001 - listing shows bad entries too
                info = f"unreadable ({err})"
            key = entry.name.rsplit(".", 1)[0]
            print(f"{tier}  {key}  {_human(entry.size):>10}  {_age(entry.mtime):>4}  {info}")
    return 0


def cmd_verify(tiers: list[tuple[str, Any]], delete_bad: bool) -> int:
    from torch_tpu.runtime import cache_entry
    from torch_tpu.runtime.errors import CacheEntryError

    checked = bad = 0
    for tier, store in tiers:
        _check_safe(store)
        for entry in store.list():
            checked += 1
            key = cache_entry.key_from_name(entry.name)
            try:
                data = store.get(entry.name)
                if data is None:
                    continue  # removed meanwhile
                cache_entry.decode(data, key)
                continue
            except CacheEntryError as err:
                reason = err.reason
            except Exception as err:  # noqa: BLE001
                reason = f"unreadable ({type(err).__name__}: {err})"
            bad += 1
            action = ""
            if delete_bad:
                store.delete(entry.name)
                action = " (deleted)"
            print(f"{tier}  {entry.name}: BAD: {reason}{action}")
    print(f"verified {checked} entries: {checked - bad} ok, {bad} bad")
    return 1 if bad and not delete_bad else 0


def cmd_clear(tiers: list[tuple[str, Any]]) -> int:
    for tier, store in tiers:
        removed = store.clear()
        print(f"{tier}  {store.location}: removed {removed} entries")
    return 0


def run(argv: list[str]) -> int:
    args = _arg_parser().parse_args(argv)
    tiers = _tiers(args)
    from torch_tpu.runtime.errors import CacheError

    try:
        if args.command == "stats":
            return cmd_stats(tiers)
        if args.command == "list":
            return cmd_list(tiers)
        if args.command == "verify":
            return cmd_verify(tiers, args.delete_bad)
        return cmd_clear(tiers)
    except CacheError as err:
        raise UsageError(str(err)) from None
    except OSError as err:
        raise UsageError(f"{err.filename or ''}: {err.strerror or err}") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(argv)
    except UsageError as err:
        sys.stderr.write(f"{PROG}: error: {str(err).splitlines()[0]}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        from torch_tpu.core import config

        if config.get("TORCH_TPU_DEBUG"):
            raise
        sys.stderr.write(
            f"{PROG}: internal error: {type(err).__name__}: {err} (TORCH_TPU_DEBUG=1 shows a traceback)\n"
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
