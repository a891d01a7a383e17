module running-count

go 1.25
