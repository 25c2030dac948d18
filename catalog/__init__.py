"""The resource catalogue: device vendors, resource flavors and their showback prices.

It sits below the tenants and the scheduler (both point down at it: quotas are per flavor, devices and
allocations are of a flavor) and imports neither.
"""
