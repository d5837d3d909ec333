"""Test helpers shared by the suites: the float64 oracle, batch builders, comparisons, child
processes, GPU exports, LLVM-assembled code objects."""
