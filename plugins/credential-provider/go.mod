module mirrorgate.io/credential-provider

go 1.24
