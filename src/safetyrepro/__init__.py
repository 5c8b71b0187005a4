"""SafetyRepro: does "model A is safer than model B" survive ordinary harness choices?"""

__version__ = "0.1.0"
