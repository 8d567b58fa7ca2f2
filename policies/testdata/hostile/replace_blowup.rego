# attacks: replace and strings.replace_n inserting a long string at every position, repeatedly
# expect: deny
package wb.admission

a := replace("0123456789abcdef0123456789abcdef", "", "0123456789abcdef0123456789abcdef")

b := replace(a, "", a)

c := strings.replace_n({"0": b, "1": b}, b)

deny contains "never" if count(c) < 0
