"""Step 3, the verdict: each component's growth per request and its class, the explanations weighed for
a rising series, and the stage whose work kept the bytes."""
