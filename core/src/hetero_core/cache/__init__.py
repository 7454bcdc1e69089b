"""Files Hetero builds once and reads at later starts: where they live (``cache_dir``), how they are
written (``atomic_file``: whole or not at all) and checked (``cache_file``: a checksum footer or a
manifest, rebuilt with one warning when damaged). Used by the CPU runtime, the model loader and
batch files; imports nothing heavy."""
