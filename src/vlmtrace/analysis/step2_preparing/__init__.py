"""Step 2, preparing: the tables (spans, requests, readings with the memory components derived), the
settled level of each component after each request, and which stage's work ran between two readings."""
