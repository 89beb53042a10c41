package promrule

//go:generate go run ./genpromrule -in ../../../deploy/prometheus/idrange.rules.yml -out ../../../deploy/kubernetes/prometheusrule.yaml
