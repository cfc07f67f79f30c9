package chattemplate

import "errors"

func asTemplateException(err error, target **TemplateException) bool { return errors.As(err, target) }
