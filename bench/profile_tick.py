"""Where a sampler tick spends its CPU: cProfile over N ticks of the real samplers on this host.

    python3 bench/profile_tick.py --ticks 100
"""
import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.engine import Engine
from exporter.nvml import Nvml
from exporter.samplers.gpm import GpmSource
from exporter.samplers.mps import MpsSampler
from exporter.samplers.nvml import NvmlSampler


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ticks", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.1)
    args = parser.parse_args()
    nvml, mps = NvmlSampler(factory=Nvml, interval=args.interval), MpsSampler(interval=args.interval)
    engine = Engine(nvml, [GpmSource(nvml), mps], interval=args.interval)
    engine.tick_devices()
    profiler = cProfile.Profile()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    profiler.enable()
    for _ in range(args.ticks):
        engine.tick_devices()
        mps.tick()
        engine.publish()
        time.sleep(args.interval)
    profiler.disable()
    cpu = time.process_time() - cpu0
    print(f"{args.ticks} ticks: {1000 * cpu / args.ticks:.2f} ms CPU per tick "
          f"({100 * cpu / (time.perf_counter() - wall0):.2f}% of a core at {args.interval} s)")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    sys.exit(main())
