"""Dumps from trainers without editing them: each integration wraps the trainer's own code at run time."""
