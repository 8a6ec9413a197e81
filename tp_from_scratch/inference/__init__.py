"""Lesson 14: tensor parallelism at inference time."""
