"""runs/schedules"""
