module space/statefile

go 1.19
