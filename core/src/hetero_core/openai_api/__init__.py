"""OpenAI's API shapes, shared by the server and batch files: the request and response models
(``protocol``) and the conversions between them and the engine's parameters and outputs (``convert``).
Imports pydantic, never FastAPI."""
