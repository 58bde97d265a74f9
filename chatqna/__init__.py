"""ChatQnA: a retrieval-augmented chat service whose follow-up questions find their evidence."""

__version__ = "0.1.0"
