# attacks: regex.split of 3,008 optional groups (12 KiB) on 60 bytes: the builtin answers no group, but regexp's FindAll, which it runs, tracks every group's positions at every step: seconds inside one call
# expect: deny
package wb.admission

g0 := "(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)"

g1 := concat("", [g0, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0])

g2 := concat("", [g1, g1, g1, g1, g1, g1, g1, g1, g1, g1, g1])

pattern := concat("", [g2, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0])

t0 := "aaaaaaaaaaaaaaaa"

text := concat("", [t0, t0, t0, "aaaaaaaaaaaa"])

deny contains "answered in time" if count(regex.split(pattern, text)) < 100
