"""Model versions and hot swap (docs/OWN_MODEL.md, "Versions and hot swap").

- repository.py: where a pipeline's versions are (a file, or a folder of numbered
  version folders) and which one is newest;
- watch.py: which version to load next (pure: given what a scan saw);
- slot.py: the scoring step executors take per batch, swapped between batches;
- manager.py: loads, warms up and swaps a version in, or refuses it with one line.
"""
