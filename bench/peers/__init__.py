"""Worker harnesses for the peers the benchmark runner compares against (one small file each)."""
