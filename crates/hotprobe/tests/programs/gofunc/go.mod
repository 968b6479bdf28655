module gofunc

go 1.19
