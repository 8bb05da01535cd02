"""GPU memory planning, configuration recommendation and the environment doctor."""
