"""What executes a step plan on the model: the AR and code2wav runners, their inputs, the
window gate, the step's audio and KV sizing."""
