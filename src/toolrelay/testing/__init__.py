"""Test doubles for the services toolrelay dispatches to."""
