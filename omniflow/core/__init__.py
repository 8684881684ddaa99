"""Core types shared by every part: requests and the scheduler/runner step contract."""
