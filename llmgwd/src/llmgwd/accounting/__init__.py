"""Accounting: limits, budgets, periods, prices and usage of keys and levels, and their shares."""
