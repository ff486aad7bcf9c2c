"""dagster"""
