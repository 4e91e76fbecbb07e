"""Placement: the scheduler, the reconciler, estimates, profiles and model shapes."""
