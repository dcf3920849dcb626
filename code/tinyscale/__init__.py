"""tinyscale: the code of the course."""
