"""Batch files (``hetero run --input-file``): ``input_file`` reads and checks the lines (``json_lines``
decodes each one within bounds), ``results`` turns outputs into rows, ``output_file`` writes them
whole and resumes, ``progress`` shows how far a run is."""
