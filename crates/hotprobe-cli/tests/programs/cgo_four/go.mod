module cgofour

go 1.19
