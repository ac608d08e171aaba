"""Tenancy: teams, who belongs to them and in which role, and what each role may open in the console.

The models are :mod:`quotas.models.tenancy`; :mod:`.roles` answers who may use which page (and draws the menu).
"""
