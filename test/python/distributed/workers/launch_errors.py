"""One launch mistake per process (argv[1]); prints the error init_process_group raised."""

import datetime
import os
import socket
import sys

import torch
import torch.distributed as dist


def main(scenario, exit_on_error=True):
    timeout = datetime.timedelta(seconds=20)
    held = None
    if scenario == "busy_port":
        # something else listens where the coordination service wants to be
        held = socket.socket()
        held.bind(("127.0.0.1", int(os.environ["MASTER_PORT"]) + 1))
        held.listen()
    try:
        if scenario == "hash_store":
            dist.init_process_group("tpu_dist", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        elif scenario == "world_mismatch":
            store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), 1, True)
            dist.init_process_group("tpu_dist", store=store, rank=0, world_size=1, timeout=timeout)
        else:  # missing_env, busy_port, tcp_init: env:// or tcp:// as given
            kwargs = {}
            if scenario == "tcp_init":
                kwargs = {"init_method": f"tcp://127.0.0.1:{os.environ.pop('TCP_PORT')}", "rank": 0, "world_size": 1}
            dist.init_process_group("tpu_dist", timeout=timeout, **kwargs)
            x = torch.ones(3, device="tpu")
            dist.all_reduce(x)
            print("INIT OK", x.cpu().tolist(), flush=True)
            dist.destroy_process_group()
            return
    except Exception as err:  # noqa: BLE001
        print(f"ERROR {type(err).__name__}: {err}", flush=True)
        if exit_on_error:
            os._exit(0)
        return
    print("NO ERROR", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "config_errors":
        # mistakes caught before the runtime starts: one process tries them in turn
        for scenario in ("missing_env", "hash_store", "world_mismatch"):
            saved = dict(os.environ)
            if scenario != "world_mismatch":
                for name in ("WORLD_SIZE", "MASTER_PORT"):
                    os.environ.pop(name, None)
            print(f"== {scenario}", flush=True)
            main(scenario, exit_on_error=False)
            os.environ.clear()
            os.environ.update(saved)
    else:
        main(sys.argv[1])
