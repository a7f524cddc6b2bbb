#!/usr/bin/env python3
"""Benchmarks, as ratios against baselines measured in the same run (see `make bench`).

- cold bake (wheel cached, pristine not) vs `unzip -q` + GNU `patch -p1` of the series;
- warm rebake (pristine cached) vs the same baseline, and its absolute time;
- the hunk engine (in process) vs GNU `patch` (a process) on the same series.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bakery.bench import main  # noqa: E402

if __name__ == "__main__":
    main()
