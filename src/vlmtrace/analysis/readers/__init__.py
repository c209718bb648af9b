"""Readers for every supported trace source, all filling one `TraceData` (see `detect.read_inputs`)."""
