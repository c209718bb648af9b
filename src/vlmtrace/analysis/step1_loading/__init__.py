"""Step 1, loading: the readers (analysis/readers/, one per input format) fill a TraceData
(analysis/trace_data.py) through the column builders here: spans, memory samples and device readings
as columns, with the attribute keys each table keeps."""
