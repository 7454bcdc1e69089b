"""What a request is: its parameters, prompt, sequence, outputs and the checks and text around them."""
