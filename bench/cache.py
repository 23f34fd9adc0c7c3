"""Compile cache tiers: cold compile vs L1 hit vs L2 hit vs L3 hit, each measured in fresh
processes, for a 20-layer MLP StableHLO module generated here.

    .venv/bin/python bench/cache.py [--layers 20] [--width 256] [--repeats 5] [--s3]

Every figure is `Client.compile()` wall time in ms (median over --repeats fresh
processes), after a warm-up compile of an unrelated tiny module in the same process,
so one-time process costs (imports, client creation, XLA initialisation) are left out of
all of them alike, and so are opening the L2/L3 stores (imports, connections). L1 is the
second compile() of the module in the process that compiled it cold. With --s3, L3 is also measured on an S3-compatible server (moto) on 127.0.0.1.

Goal: an L3 hit in a fresh process >= 5x faster than a cold compile. Not a test:
nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

CHILD = textwrap.dedent(
    """
    import json, sys, time
    from torch_tpu.runtime import CacheConfig, Client
    spec = json.loads(sys.argv[1])
    cfg = CacheConfig(l2_dir=spec["l2"], l3_url=spec["l3"], l3_storage_options=spec.get("opts") or {})
    client = Client.create("cpu", cache_config=cfg)
    warm = '''module @warm { func.func public @main(%a: tensor<f32>) -> tensor<f32> {
        %0 = stablehlo.add %a, %a : tensor<f32>
        return %0 : tensor<f32> } }'''
    Client.create("cpu").compile(warm)  # one-time XLA initialisation, outside the timings
    for store in (client.cache.l2, client.cache.l3):  # open the stores (imports, sessions) first
        if store is not None:
            store.ensure()
    text = open(spec["module"]).read()
    t0 = time.perf_counter()
    exe = client.compile(text, name="mlp")
    first = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    again = client.compile(text, name="mlp")
    second = (time.perf_counter() - t0) * 1e3
    assert again is exe
    print(json.dumps({"ms": first, "origin": exe.origin, "l1_ms": second}))
    """
)


def _mlp(layers: int, width: int, batch: int) -> str:
    x = f"tensor<{batch}x{width}xf32>"
    w = f"tensor<{width}x{width}xf32>"
    b = f"tensor<{width}xf32>"
    args = [f"%x: {x}"] + [f"%w{i}: {w}, %b{i}: {b}" for i in range(layers)]
    lines = [f"    %zero = stablehlo.constant dense<0.0> : {x}"]
    cur = "%x"
    for i in range(layers):
        lines += [
            f"    %d{i} = stablehlo.dot_general {cur}, %w{i}, contracting_dims = [1] x [0] : ({x}, {w}) -> {x}",
            f"    %bb{i} = stablehlo.broadcast_in_dim %b{i}, dims = [1] : ({b}) -> {x}",
            f"    %s{i} = stablehlo.add %d{i}, %bb{i} : {x}",
            f"    %h{i} = stablehlo.maximum %s{i}, %zero : {x}",
        ]
        cur = f"%h{i}"
    return (
        f"module @mlp{layers} {{\n  func.func public @main({', '.join(args)}) -> {x} {{\n"
        + "\n".join(lines)
        + f"\n    return {cur} : {x}\n  }}\n}}\n"
    )


def _child(spec: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_CACHE")}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5, help="fresh processes per tier (median reported)")
    p.add_argument("--s3", action="store_true", help="also measure L3 on a local S3-compatible server (needs moto[server], s3fs)")
    args = p.parse_args(argv)

    work = tempfile.mkdtemp(prefix="torchtpu-bench-cache-")
    module = os.path.join(work, "mlp.mlir")
    with open(module, "w") as f:
        f.write(_mlp(args.layers, args.width, args.batch))
    l2, l3 = os.path.join(work, "l2"), os.path.join(work, "l3")

    cold, l1 = [], []
    for _ in range(args.repeats):
        r = _child({"module": module, "l2": None, "l3": None})
        assert r["origin"] == "compile", r
        cold.append(r["ms"])
        l1.append(r["l1_ms"])
    populate = _child({"module": module, "l2": l2, "l3": "file://" + l3})
    assert populate["origin"] == "compile", populate
    l2_hits = []
    for _ in range(args.repeats):
        r = _child({"module": module, "l2": l2, "l3": None})
        assert r["origin"] == "l2", r
        l2_hits.append(r["ms"])
    l3_hits = []
    for _ in range(args.repeats):
        r = _child({"module": module, "l2": None, "l3": "file://" + l3})
        assert r["origin"] == "l3", r
        l3_hits.append(r["ms"])

    rows = [
        ("cold compile (fresh process)", cold),
        ("L1 hit (same process)", l1),
        ("L2 hit (fresh process)", l2_hits),
        ("L3 hit, file:// (fresh process)", l3_hits),
    ]
    if args.s3:
        rows.append(("L3 hit, s3:// on moto (fresh process)", _s3_hits(module, args.repeats)))

    size = sum(os.path.getsize(os.path.join(l3, n)) for n in os.listdir(l3))
    print(
        f"compile cache, {args.layers}-layer MLP (batch {args.batch}, width {args.width}, f32), XLA:CPU, "
        f"median of {args.repeats} processes; entry {size / 1024:.0f} KiB"
    )
    print(f"{'tier':<40} {'ms':>10} {'vs cold':>9}")
    cold_ms = statistics.median(cold)
    for name, values in rows:
        ms = statistics.median(values)
        print(f"{name:<40} {ms:>10.3f} {cold_ms / ms:>8.1f}x")
    print(f"ratio cold / L3 hit = {cold_ms / statistics.median(l3_hits):.1f}x   (goal >= 5x)")
    return 0


def _s3_hits(module: str, repeats: int) -> list[float]:
    import s3fs
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        opts = {"endpoint_url": f"http://{host}:{port}", "key": "testing", "secret": "testing"}
        s3fs.S3FileSystem(**opts).mkdir("bench")
        url = "s3://bench/executables"
        assert _child({"module": module, "l2": None, "l3": url, "opts": opts})["origin"] == "compile"
        hits = []
        for _ in range(repeats):
            r = _child({"module": module, "l2": None, "l3": url, "opts": opts})
            assert r["origin"] == "l3", r
            hits.append(r["ms"])
        return hits
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
