"""The experiments wing: one-off measurements behind a figure or a sentence, not the lesson or the bench.

Each module reads back (or helps run) an experiment whose GPU script lives in
``measurements/scripts/``; its rows ship in ``moe_tutorial/data/``, and a notebook reads them here:

* :mod:`.profiling`: launch counts, host syncs and allocations with ``torch.profiler``
  (notebooks 01 and 02);
* :mod:`.part3_cap`: why Part 3's kernel stops near 10 TFLOP/s (notebook 03;
  ``measurements/scripts/h200_part3_cap.py``);
* :mod:`.limits`: where Part 4 stops short of the floor, and the levers tried (notebook 05's
  appendix; ``measurements/scripts/h200_limit_experiments.py``);
* :mod:`.fp8_decode`: Part 7's layer at decode in two launches, kernels and reader (notebook 07's
  appendix; ``measurements/scripts/h200_fp8_decode.py``): measured, and not the package's path.

The ground floor never imports this wing: ``kernels/`` and ``perf/`` work without it.
"""
